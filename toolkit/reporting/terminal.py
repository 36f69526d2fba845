"""One table per bundle: what convert measured on this host beside what check measured on each device.

Columns: artifact, precision, size (and x fp32 of the same format), accuracy vs the float model, host latency,
device, device latency p50/p90, load time, peak memory, gate verdict. One row per artifact and device (an
artifact not checked anywhere gets one row with the device columns empty). Colour (verdicts, header) only when
``colour`` is true: the CLI passes ``stdout.isatty()``, so piped output stays plain text.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any  # Any: JSON values; run_summary's api.RunResult (a higher layer)

from toolkit.model.quantized import precision_label
from toolkit.model.device_records import CheckReport
from toolkit.model.artifact import Verification
from toolkit.model.manifest import Manifest
from toolkit.model.vocabulary import Precision

HEADERS = ("artifact", "precision", "size", "accuracy (float)", "host p50", "device", "p50", "p90", "load",
           "peak mem", "gate")
_STYLES: dict[str, dict[str, str | bool]] = {
    "PASS": {"fg": "green", "bold": True}, "FAIL": {"fg": "red", "bold": True},
    "ERROR": {"fg": "red", "bold": True}, "-": {"dim": True}}


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def human_bytes(count: float) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def ms_text(value: float | None) -> str:
    """A time in milliseconds as shown in the tables: 3 decimals under 10 ms, 1 above; '-' for none."""
    if value is None:
        return "-"
    value = float(value)
    return f"{value:.3f} ms" if value < 10 else f"{value:.1f} ms"


def _report_dict(report: CheckReport | Mapping[str, Any]) -> Mapping[str, Any]:
    return report.to_dict() if isinstance(report, CheckReport) else report


def verdict(report: Mapping[str, Any]) -> str:
    if report.get("error"):
        return "ERROR"
    gates = report.get("gates") or {}
    return "PASS" if gates.get("passed") else "FAIL"


def accuracy_text(verification: Verification | None) -> str:
    if verification is None:
        return "-"
    if verification.accuracy is not None:
        ref = verification.reference_accuracy
        return f"{verification.accuracy:.3f} ({ref:.3f})" if ref is not None else f"{verification.accuracy:.3f}"
    if verification.top1_agreement is not None:
        return f"agree {verification.top1_agreement:.3f}"
    return f"cos {verification.cosine_similarity:.4f}"


def bundle_rows(manifest: Manifest, reports: Sequence[CheckReport | Mapping[str, Any]]) -> list[list[str]]:
    by_artifact: dict[str, list[Mapping[str, Any]]] = {}
    for report in reports:
        data = _report_dict(report)
        by_artifact.setdefault(str(data.get("artifact")), []).append(data)
    fp32 = {a.format: a.bytes for a in manifest.artifacts if a.precision == Precision.FP32}
    rows = []
    for a in manifest.artifacts:
        size = human_bytes(a.bytes)
        if a.precision != Precision.FP32 and fp32.get(a.format):
            size += f" ({a.bytes / fp32[a.format]:.2f}x)"
        precision = precision_label(a.precision, a.recipe, a.quantized)
        base = [a.file, precision, size, accuracy_text(a.verification), ms_text(a.host_latency_ms)]
        checked = by_artifact.get(a.file) or []
        if not checked:
            rows.append(base + ["-", "-", "-", "-", "-", "-"])
        for r in checked:
            lat = r.get("latency_ms") or {}
            rss = r.get("peak_rss_mb")
            rows.append(base + [
                str(r.get("device")), ms_text(lat.get("p50")), ms_text(lat.get("p90")), ms_text(r.get("load_ms")),
                f"{rss:.0f} MB" if rss is not None else "-", verdict(r),
            ])
    return rows


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, colour: bool = False,
                 styled_column: int | None = None) -> str:
    """Left-aligned columns; cells are padded before they are styled so colour never breaks the alignment."""
    import click

    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def style(text: str, **kwargs: Any) -> str:
        return click.style(text, **kwargs) if colour else text

    lines = [style("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), bold=True)]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        cells = []
        for i, (cell, width) in enumerate(zip(row, widths)):
            padded = cell.ljust(width) if i < len(row) - 1 else cell
            if i == styled_column and cell in _STYLES:
                padded = style(padded, **_STYLES[cell])
            cells.append(padded)
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def bundle_table(manifest: Manifest, reports: Sequence[CheckReport | Mapping[str, Any]], *,
                 colour: bool = False, bundle_dir: str | Path | None = None) -> str:
    """The per-bundle table, with a title line (name, target, where it is) and the gate reasons under it."""
    import click

    title = f"bundle {manifest.name}  target {manifest.target.name or '-'}  source {manifest.source.framework}"
    if bundle_dir is not None:
        title += f"  ({bundle_dir})"
    lines = [click.style(title, bold=True) if colour else title, "",
             render_table(HEADERS, bundle_rows(manifest, reports), colour=colour, styled_column=len(HEADERS) - 1)]
    reasons = [
        f"  {reason}"
        for report in reports
        for reason in (_report_dict(report).get("gates") or {}).get("reasons", [])
    ]
    if reasons:
        lines += ["", "gates:", *reasons]
    inside = []
    for report in reports:
        data = _report_dict(report)
        extra = inside_lines(data) if any(data.get(k) for k in ("profile", "throughput", "loads")) else []
        if extra:
            inside += [f"  {data.get('artifact')} on {data.get('device')}:", *(f"  {line}" for line in extra)]
    if inside:
        lines += ["", "inside the runs (--profile / --throughput / --loads):", *inside]
    evaluated = [_report_dict(r) for r in reports if _report_dict(r).get("evaluation")]
    if evaluated:
        lines += ["", "the eval set on the device (--eval):",
                  *(f"  {d.get('device')}: {eval_line(str(d.get('artifact')), d['evaluation'])}" for d in evaluated)]
    return "\n".join(lines)


def run_summary(result: Any, *, colour: bool = False) -> str:
    """What ``edgetk run`` / ``quickstart`` print: the bundle table, the verdict, and what to do next."""
    import click

    reports = [r for d in result.devices for r in d.reports]
    parts = [bundle_table(result.manifest, reports, colour=colour, bundle_dir=result.bundle_dir), ""]
    for device in result.devices:
        if device.selected is not None:
            parts.extend(f"{device.device}: {line}" for line in selection_lines(device.selected.to_dict()))
        if device.error:
            parts.append(f"{device.device}: {device.error}")
    if result.passed:
        verdict_line = f"PASS: {result.manifest.name} converted, deployed and checked on " \
                       f"{len(result.devices)} device(s)"
        parts.append(click.style(verdict_line, fg="green", bold=True) if colour else verdict_line)
    else:
        line = f"FAIL at {result.failed_stage} (exit {result.exit_code})"
        parts.append(click.style(line, fg="red", bold=True) if colour else line)
    parts.append(f"bundle: {Path(result.bundle_dir).resolve()}")
    return "\n".join(parts)


def labelled(artifact: str, label: object) -> str:
    """``model.int8.tflite (int8 mixed: 2% of weights int)``: a file with the label a selection recorded for it
    where its name says too little (``toolkit.model.quantized.label_beyond``)."""
    return f"{artifact} ({label})" if label else artifact


def selection_lines(selected: Mapping[str, Any] | None) -> list[str]:
    """``selected: model.int8.tflite (p50 1.234 ms): the fastest that passes here`` (with the artifact's label
    before its p50: ``int8 mixed: 2% of weights int``), the proposal when it differs, and each artifact that was
    not in the running with why."""
    if not selected:
        return []
    artifact = selected.get("artifact")
    if artifact is None:
        return [f"selected: nothing: {selected.get('reason')}"]
    p50 = selected.get("p50_ms")
    details = [str(selected["label"])] if selected.get("label") else []
    details += [f"p50 {p50:.3f} ms"] if isinstance(p50, (int, float)) else []
    head = f"selected: {artifact}" + (f" ({', '.join(details)})" if details else "")
    lines = [f"{head}{' [pinned]' if selected.get('pinned') else ''}: {selected.get('reason')}"]
    contenders = selected.get("contenders") or ()
    labels = {c.get("artifact"): c.get("label") for c in contenders}
    proposed = selected.get("proposed")
    if proposed and proposed != artifact:
        lines.append(f"  the manifest proposed {labelled(proposed, labels.get(proposed))}; this device's "
                     "measurements decided")
    for c in contenders:
        if c.get("excluded"):
            lines.append(f"  not selectable: {labelled(c['artifact'], c.get('label'))}: {c['excluded']}")
    return lines


# ------------------------------------------------------------------------------------------ inside a run


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    value = float(value)
    return f"{value:,.0f}/s" if value >= 100 else f"{value:.1f}/s"


def placement_line(placement: Mapping[str, Any] | None) -> str | None:
    """``placement: 2/3 nodes on XNNPACK (time share ?), fell back: CUMSUM``, or None when nothing was counted."""
    if not placement or placement.get("nodes_total") is None:
        return None
    share = placement.get("time_share_on_intended")
    text = (f"placement: {placement.get('nodes_on_intended')}/{placement['nodes_total']} nodes on "
            f"{placement.get('intended')}")
    if share is not None:
        text += f" ({100 * float(share):.0f}% of the time)"
    ops = placement.get("fallback_ops") or []
    if ops:
        text += ", fell back: " + ", ".join(str(op) for op in ops[:8]) + (" ..." if len(ops) > 8 else "")
    return text


def profile_lines(profile: Mapping[str, Any] | None, *, top: int = 5) -> list[str]:
    """The top operator types by time (or, where the runtime cannot time operators, by node count)."""
    if not profile:
        return []
    if profile.get("error"):
        return [f"profile: {profile['error']}"]
    types = list(profile.get("by_op_type") or [])[:top]
    if not profile.get("available"):
        counted = ", ".join(f"{t.get('op_type')} x{t.get('nodes')}" for t in types)
        return [f"profile: no per-operator times from this runtime; ops: {counted}"]
    overhead = profile.get("overhead") or {}
    head = f"profile: {profile.get('total_ms', 0):.3f} ms of operator time per inference ({profile.get('runs')} runs"
    if overhead.get("ratio") is not None:
        head += f", profiler overhead {overhead['ratio']:.2f}x"
    lines = [head + ")"]
    for t in types:
        lines.append(f"  {str(t.get('op_type')):<20} x{t.get('nodes'):<3} {ms_text(t.get('time_ms')):>10}  "
                     f"{100 * float(t.get('share') or 0):5.1f}%")
    return lines


def throughput_line(throughput: Mapping[str, Any] | None) -> str | None:
    if not throughput:
        return None
    if throughput.get("error"):
        return f"throughput: {throughput['error']}"
    key = "batch" if throughput.get("mode") == "batch" else "in_flight"
    label = "batch" if key == "batch" else "in flight"
    points = ", ".join(f"{label} {p.get(key)}: {_rate(p.get('inferences_per_s'))} (p50 {ms_text((p.get('latency_ms') or {}).get('p50'))})"
                       for p in throughput.get("points") or [])
    per_sample = throughput.get("per_sample") or {}
    suffix = ""
    if per_sample:
        suffix = "; outputs per sample equal batch 1" if per_sample.get("ok") else "; OUTPUTS DIFFER FROM BATCH 1"
    return f"throughput: {points}{suffix}"


def loads_lines(loads: Mapping[str, Any] | None) -> list[str]:
    if not loads:
        return []

    def one(entry: Mapping[str, Any] | None) -> str:
        entry = entry or {}
        if entry.get("error"):
            return f"error ({(entry['error'] or {}).get('message')})"
        return f"load {ms_text(entry.get('load_ms'))} + first {ms_text(entry.get('first_inference_ms'))}"

    cold = loads.get("cold") or {}
    cache = cold.get("page_cache") or {}
    lines = [f"loads: cold {one(cold)}; warm {one(loads.get('warm'))}"]
    if cache.get("note"):
        lines.append(f"  {cache['note']}")
    for option in loads.get("options") or []:
        if option.get("available") is False:
            lines.append(f"  {option.get('name')}: {option.get('note')}")
            continue
        lines.append(f"  {option.get('name')}: before {one(option.get('before'))}; after {one(option.get('after'))}")
    from toolkit.reporting.load_advice import paying_options

    advice = paying_options(loads)
    if advice:
        lines.append("  pays here: " + "; ".join(a.words() for a in advice))
    elif any("_range" in "".join((o.get("after") or {}).keys()) for o in loads.get("options") or []):
        lines.append("  no ONNX Runtime session option paid here beyond the noise of its rounds")
    return lines


def inside_lines(report: Mapping[str, Any]) -> list[str]:
    """What check --profile / --throughput / --loads measured for one report, indented under its row."""
    lines = [placement_line(report.get("placement"))]
    lines += profile_lines(report.get("profile"))
    lines.append(throughput_line(report.get("throughput")))
    lines += loads_lines(report.get("loads"))
    return [f"  {line}" for line in lines if line]


# --------------------------------------------------------------------------------------------- eval set


def eval_line(artifact: str, result: Mapping[str, Any]) -> str:
    """One line for the terminal: the device against the labels and the float model, side by side."""
    if not result.get("available"):
        return f"{artifact}: eval set not run: {result.get('note')}"
    parts = []
    vs_labels = result.get("vs_labels")
    if vs_labels:
        parts.append(f"accuracy on the device {_pct(vs_labels.get('device_accuracy'))} vs the float model "
                     f"{_pct(vs_labels.get('float_accuracy'))}")
    agreement = (result.get("vs_float") or {}).get("top1_agreement")
    if agreement is not None:
        parts.append(f"top-1 agreement with the float model {_pct(agreement)}")
    else:
        parts.append(f"cosine with the float model {(result.get('vs_float') or {}).get('cosine_similarity')}")
    line = (f"{artifact}: eval set on the device ({result.get('samples')} samples, {result.get('chunks')} chunks of "
            f"up to {result.get('chunk')}): " + "; ".join(parts))
    return line + (f" ({result['note']})" if result.get("note") else "")


def eval_row(report: Mapping[str, Any]) -> list[object]:
    """artifact, device, samples, device vs labels, float vs labels, device vs float (top-1 agreement, else
    cosine), note: one row of the report's table."""
    result = report.get("evaluation") or {}
    labels = result.get("vs_labels") or {}
    vs_float = result.get("vs_float") or {}
    agreement = vs_float.get("top1_agreement")
    return [report.get("artifact"), report.get("device"), result.get("samples", "-"),
            _pct(labels.get("device_accuracy")), _pct(labels.get("float_accuracy")),
            f"top-1 {_pct(agreement)}" if agreement is not None else f"cosine {vs_float.get('cosine_similarity')}",
            result.get("note") or ""]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * float(value):.1f}%"
