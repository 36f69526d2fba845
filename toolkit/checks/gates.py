"""The judgements behind the placement, throughput and regression gates of one measured report (the gate itself,
and where its thresholds come from: :mod:`toolkit.checks.checking`): a failure line naming the artifact, or a
note on why the gate could not judge."""

from __future__ import annotations

from collections.abc import Mapping

from toolkit.model.policy import PlacementExpectation, RegressionPolicy
from toolkit.model.device_records import CheckReport
from toolkit.model.records import JsonDict
from toolkit.model.vocabulary import Format
from toolkit.regression import RegressionVerdict


def _same_place(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


def _op_label(entry: object) -> str:
    if isinstance(entry, Mapping):
        op, name = entry.get("op_type"), entry.get("name")
        label = " ".join(str(p) for p in (op, name) if p)
        return f"{label} (on {entry['on']})" if entry.get("on") else label or "?"
    return str(entry)


def _fallback_text(ops: object, limit: int = 8) -> str:
    labels = [_op_label(e) for e in ops] if isinstance(ops, list) else []
    if not labels:
        return ""
    shown = ", ".join(labels[:limit])
    return f"; fell back: {shown}" + (f" and {len(labels) - limit} more" if len(labels) > limit else "")


EMULATED_PLACEMENT = ("placement of {name}: not judged on an emulated device (the probe saw an ARM kernel on an x86 "
                      "CPU); check {want} on the real board")


def judge_placement(report: CheckReport, expectation: PlacementExpectation) -> tuple[str | None, str | None,
                                                                                    JsonDict]:
    """(failure, skip note, detail) of one placement expectation for one measured artifact."""
    name, want, floor = report.artifact, expectation.on, expectation.min_nodes_pct
    detail: JsonDict = {"artifact": name, "expected": want, "min_nodes_pct": floor}
    placement = report.placement or {}
    runtime = report.runtime or {}
    missing = [str(p) for p in runtime.get("providers_missing") or []]
    total = placement.get("nodes_total")
    if placement.get("intended") is not None and isinstance(total, int) and total > 0:
        intended = str(placement["intended"])
        on = int(placement.get("nodes_on_intended") or 0)
        share = 100.0 * on / total
        detail.update(intended=intended, nodes_total=total, nodes_on_expected=on if _same_place(intended, want)
                      else None, time_share_on_intended=placement.get("time_share_on_intended"))
        if not _same_place(intended, want):
            return (f"{name}: the target expects its nodes on {want}, but the artifact asks for {intended} "
                    f"(rebuild the bundle for this target)", None, detail)
        if share + 1e-9 < floor:
            why = f" ({want} is not available in this runtime)" if want in missing else ""
            return (f"{name}: {on} of {total} nodes ({share:.0f}%) ran on {want}{why}; the target expects at "
                    f"least {floor:g}%{_fallback_text(placement.get('fallback_ops'))}", None, detail)
        return None, None, detail
    if expectation.format == Format.ONNX:
        used = [str(p) for p in runtime.get("providers") or []]
        detail.update(providers=used, providers_missing=missing)
        if not any(_same_place(p, want) for p in used):
            why = ("this onnxruntime does not have it" if want in missing
                   else "the session was not opened with it")
            return (f"{name}: no node ran on {want} ({why}; the session ran on {', '.join(used) or 'no provider'}), "
                    f"so every node fell back to the CPU; the target expects at least {floor:g}% on {want}",
                    None, detail)
        return None, f"placement of {name}: {want} was used, but the runner reported no per-node placement", detail
    return None, f"placement of {name}: the runner reported no per-node placement to judge {want}", detail


def regression_text(name: str, verdict: RegressionVerdict, policy: RegressionPolicy, explicit: bool) -> str:
    assert verdict.current_p50_ms is not None and verdict.reference_ms is not None
    against = (f"baseline {verdict.baseline_checks[0]}" if explicit
               else f"the slowest of the last {len(verdict.baseline_checks)} checks")
    return (f"{name}: p50 {verdict.current_p50_ms:.3f} ms is {verdict.ratio:.2f}x {against} "
            f"({verdict.reference_ms:.3f} ms; {verdict.baseline_samples} baseline samples, Mann-Whitney "
            f"p={verdict.p_value:.2g}); a regression is more than +{policy.min_slowdown_pct:g}% and "
            f"+{policy.min_slowdown_ms:g} ms"
            + (f"; a second runner process confirmed it (p50 {verdict.confirm_p50_ms:.3f} ms)"
               if verdict.confirmed else ""))


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
