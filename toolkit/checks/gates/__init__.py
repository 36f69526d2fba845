"""The check gates as one list: each gate judges one measured report against its limits from the bundle's check
policy (:mod:`toolkit.checks.gates.gate`), and :func:`judge` folds their verdicts, in ``GATES`` order, into the
report's ``GateResult``. What each gate checks is in docs/verification.md; how to add one, docs/design.md."""

from __future__ import annotations

from collections.abc import Sequence

from toolkit.checks.gates.gate import NO_POLICY, Evidence, Gate, Limits, Verdict
from toolkit.checks.gates.measured import BudgetGate, OutputsGate, RanGate
from toolkit.checks.gates.placement import PlacementGate
from toolkit.checks.gates.regression import RegressionGate
from toolkit.checks.gates.throughput import ThroughputGate
from toolkit.model.device_records import GateResult
from toolkit.model.records import JsonDict

__all__ = ["GATES", "NO_POLICY", "Evidence", "Gate", "Limits", "Verdict", "judge"]

GATES: tuple[Gate, ...] = (RanGate(), OutputsGate(), BudgetGate(), RegressionGate(), PlacementGate(),
                           ThroughputGate())


def judge(evidence: Evidence, limits: Limits, gates: Sequence[Gate] = GATES) -> GateResult:
    """Every gate's verdict on one report, folded: failures and notes in gate order (a note once), details by
    key; a final verdict (the artifact did not run) ends the judging."""
    failures: list[str] = []
    skipped: list[str] = [NO_POLICY] if limits.policy is None else []
    details: JsonDict = {}
    for gate in gates:
        verdict = gate.judge(evidence, limits)
        failures += verdict.failures
        skipped += verdict.skipped
        details.update(verdict.details)
        if verdict.final:
            break
    return GateResult(not failures, tuple(failures), tuple(dict.fromkeys(skipped)), details)
