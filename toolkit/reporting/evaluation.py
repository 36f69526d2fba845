"""How a device's eval-set result (``check --eval``, :mod:`toolkit.checks.device_eval`) reads: one terminal line,
one row of the HTML report's table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


def eval_row(report: Mapping[str, Any]) -> list[Any]:
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


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100.0 * float(value):.1f}%"
