"""The placement gate: where an artifact's nodes ran against the check policy's placement expectations (a
TFLite delegate, an ONNX Runtime execution provider, the ExecuTorch backend), each judged by
:func:`judge_placement`: a failure line naming the artifact, or a note on why it could not judge."""

from __future__ import annotations

from collections.abc import Mapping

from dataclasses import dataclass

from toolkit.checks.gates.gate import Evidence, Limits, Verdict
from toolkit.model.policy import PlacementExpectation
from toolkit.model.device_records import CheckReport
from toolkit.model.records import JsonDict
from toolkit.model.vocabulary import Format


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


@dataclass(frozen=True)
class PlacementGate:
    """Every placement expectation of the policy that applies to the artifact (its format and file glob); on an
    emulated device (qemu-user runs the ARM build on an x86 host) where the nodes of a TFLite or ONNX artifact run
    says nothing of the real board (XNNPACK takes no LiteRT node there), so its placement is reported, not
    judged. A .pte carries its delegation in the program (counted at convert time): the same on any board."""

    def judge(self, evidence: Evidence, limits: Limits) -> Verdict:
        report, fmt = evidence.report, evidence.artifact_format
        expectations = limits.policy.placement if limits.policy is not None else ()
        emulated = bool((report.environment or {}).get("emulated"))
        failures, skipped, checked = [], [], []
        for expectation in expectations:
            if fmt is None or not expectation.applies_to(report.artifact, fmt):
                continue
            failure, skip, detail = judge_placement(report, expectation)
            if emulated and expectation.format != Format.PTE:
                detail["judged"] = False
                skip = EMULATED_PLACEMENT.format(name=report.artifact, want=expectation.on) + (
                    f" (here: {failure})" if failure else "")
                failure = None
            checked.append(detail)
            failures += [failure] if failure else []
            skipped += [skip] if skip else []
        return Verdict(tuple(failures), tuple(skipped), {"placement": checked} if checked else {})
