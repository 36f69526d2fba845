"""The gates every check judges, whatever the policy: the artifact ran (else no other gate judges it), its
outputs match the golden outputs, and its latency was measured and keeps the budget."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.checks.gates.gate import Evidence, Limits, Verdict


@dataclass(frozen=True)
class RanGate:
    """A report with an error (the runtime is missing, the artifact did not load, a figure was impossible) fails
    here and is judged no further."""

    def judge(self, evidence: Evidence, limits: Limits) -> Verdict:
        err = evidence.report.error
        if not err:
            return Verdict()
        hint = f" ({err.get('hint')})" if err.get("hint") else ""
        return Verdict((f"{evidence.report.artifact}: could not run: {err.get('kind')}: {err.get('message')}{hint}",),
                       final=True)


@dataclass(frozen=True)
class OutputsGate:
    """The device's outputs against the golden outputs the host recorded (the runner's ``outputs_match``)."""

    def judge(self, evidence: Evidence, limits: Limits) -> Verdict:
        match = evidence.report.outputs_match or {}
        if match.get("ok"):
            return Verdict()
        return Verdict((f"{evidence.report.artifact}: outputs differ from the golden outputs (max abs error "
                        f"{match.get('max_abs_error')}, top-1 agreement {match.get('top1_agreement')})",))


@dataclass(frozen=True)
class BudgetGate:
    """p90 latency within the budget: ``--budget-ms``, else the policy's ``latency_budget_ms`` (none: a note)."""

    def judge(self, evidence: Evidence, limits: Limits) -> Verdict:
        name, lat, budget = evidence.report.artifact, evidence.report.latency_ms, limits.budget
        if lat is None:
            return Verdict.of(f"{name}: no latency was measured")
        if budget.ms is not None:
            if lat.p90 > budget.ms:
                return Verdict.of(f"{name}: p90 {lat.p90:.3f} ms exceeds the budget of {budget.ms:g} ms "
                                  f"({budget.source})")
            return Verdict()
        return Verdict.of(skip=budget.skip)
