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
from typing import Any

from toolkit.types import CheckReport, Manifest

HEADERS = ("artifact", "precision", "size", "accuracy (float)", "host p50", "device", "p50", "p90", "load",
           "peak mem", "gate")
_STYLES: dict[str, dict[str, Any]] = {"PASS": {"fg": "green", "bold": True}, "FAIL": {"fg": "red", "bold": True},
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


def _ms(value: Any) -> str:
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


def accuracy_text(verification: Any) -> str:
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
    fp32 = {a.format: a.bytes for a in manifest.artifacts if a.precision == "fp32"}
    rows = []
    for a in manifest.artifacts:
        size = human_bytes(a.bytes)
        if a.precision != "fp32" and fp32.get(a.format):
            size += f" ({a.bytes / fp32[a.format]:.2f}x)"
        base = [a.file, a.precision, size, accuracy_text(a.verification), _ms(a.host_latency_ms)]
        checked = by_artifact.get(a.file) or []
        if not checked:
            rows.append(base + ["-", "-", "-", "-", "-", "-"])
        for r in checked:
            lat = r.get("latency_ms") or {}
            rss = r.get("peak_rss_mb")
            rows.append(base + [
                str(r.get("device")), _ms(lat.get("p50")), _ms(lat.get("p90")), _ms(r.get("load_ms")),
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
                 colour: bool = False, bundle_dir: Any = None) -> str:
    """The per-bundle table, with a title line (name, target, where it is) and the gate reasons under it."""
    import click

    title = f"bundle {manifest.name}  target {manifest.target or '-'}  source {manifest.source.framework}"
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
    return "\n".join(lines)


def run_summary(result: Any, *, colour: bool = False) -> str:
    """What ``edgetk run`` / ``quickstart`` print: the bundle table, the verdict, and what to do next."""
    import click

    reports = [r for d in result.devices for r in d.reports]
    parts = [bundle_table(result.manifest, reports, colour=colour, bundle_dir=result.bundle_dir), ""]
    for device in result.devices:
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
