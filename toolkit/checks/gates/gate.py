"""What a gate is: one object that judges one measured report (:class:`Evidence`) against its limits from the
bundle's check policy (:class:`Limits`) and returns a :class:`Verdict`. :mod:`toolkit.checks.gates` folds the
verdicts of every gate in ``GATES`` into the report's ``GateResult``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from toolkit.model.device_records import CheckReport
from toolkit.model.policy import Budget, CheckPolicy, GateOptions, RegressionPolicy, budget_for
from toolkit.model.records import JsonObject
from toolkit.regression import RegressionVerdict

NO_POLICY = ("the bundle carries no check policy (built by an older edgetk): its target's latency budget and "
             "placement expectations are unknown and the regression gate uses the default thresholds; rebuild it "
             "with `edgetk convert`, or pass --budget-ms")


@dataclass(frozen=True)
class Limits:
    """What every gate judges against: the bundle's check policy (None: built before the policy existed, and
    :data:`NO_POLICY` says so) with the user's overrides (``--budget-ms``, ``--regression-pct``). A gate reads its
    own limit from ``policy``'s fields; only the overridden ones are resolved here."""

    policy: CheckPolicy | None
    options: GateOptions = GateOptions()

    @property
    def budget(self) -> Budget:
        return budget_for(self.policy, self.options)

    @property
    def regression(self) -> RegressionPolicy:
        base = self.policy.regression if self.policy is not None else RegressionPolicy()
        if self.options.regression_pct is not None:
            return replace(base, min_slowdown_pct=self.options.regression_pct)
        return base


@dataclass(frozen=True)
class Evidence:
    """One artifact's measured report and what the check decided about it before the gates (its format; the
    regression verdict against the history, None when no baseline was asked for; whether the user named the
    baseline check)."""

    report: CheckReport
    artifact_format: str | None = None
    regression: RegressionVerdict | None = None
    explicit_baseline: bool = False


@dataclass(frozen=True)
class Verdict:
    """One gate's judgement: ``failures`` fail the check, ``skipped`` notes say why it could not judge,
    ``details`` go to the report's ``gates.details`` under the gate's own key; ``final``: no later gate judges
    this report (it did not run)."""

    failures: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    details: JsonObject = field(default_factory=dict)
    final: bool = False

    @classmethod
    def of(cls, failure: str | None = None, skip: str | None = None) -> Verdict:
        """At most one failure and one note (None: none)."""
        return cls(failures=(failure,) if failure else (), skipped=(skip,) if skip else ())


class Gate(Protocol):
    """A check gate: judges one report against its limits. A new gate is one module with one class that does
    this, and one entry in ``toolkit.checks.gates.GATES`` (docs/design.md, "Where a new thing goes")."""

    def judge(self, evidence: Evidence, limits: Limits) -> Verdict: ...
