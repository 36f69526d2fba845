"""The throughput gates (``check --throughput``): batched outputs equal batch-1 outputs per sample, and the best
point of the measured curve reaches the policy's ``min_throughput_ips``."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.checks.gates.gate import Evidence, Limits, Verdict
from toolkit.model.device_records import CheckReport


@dataclass(frozen=True)
class ThroughputGate:
    """:func:`judge_throughput` with the policy's floor (None: no floor)."""

    def judge(self, evidence: Evidence, limits: Limits) -> Verdict:
        floor = limits.policy.min_throughput_ips if limits.policy is not None else None
        return Verdict.of(*judge_throughput(evidence.report, floor))


def judge_throughput(report: CheckReport, floor: float | None) -> tuple[str | None, str | None]:
    """(failure, skip note) of the throughput gates: batched outputs must equal batch-1 outputs per sample, and
    the best point of the curve must reach the policy's floor (skipped, and said, without --throughput)."""
    name = report.artifact
    curve = report.throughput or {}
    per_sample = curve.get("per_sample") or {}
    if per_sample.get("ok") is False:
        bad = [c for c in per_sample.get("checks") or [] if not c.get("ok")]
        worst = ", ".join(f"batch {c.get('batch')}: max abs error {c.get('max_abs_error')}" for c in bad)
        return (f"{name}: outputs at batch > 1 differ from batch-1 outputs per sample ({worst}; tolerance "
                f"{per_sample.get('tolerance')})", None)
    if floor is None:
        return None, None
    points = [p for p in curve.get("points") or [] if p.get("inferences_per_s")]
    if not points:
        why = curve.get("error") or "run the check with --throughput"
        return None, f"throughput floor of {floor:g}/s for {name}: not measured ({why})"
    best = max(points, key=lambda p: float(p["inferences_per_s"]))
    where = (f"batch {best.get('batch')}" if curve.get("mode") == "batch"
             else f"{best.get('in_flight')} requests in flight")
    if float(best["inferences_per_s"]) < floor:
        return (f"{name}: at most {float(best['inferences_per_s']):.1f} inferences/s ({where}); the target asks "
                f"for at least {floor:g}/s", None)
    return None, None
