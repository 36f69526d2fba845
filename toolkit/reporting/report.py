"""Plain-text tables for the terminal: what convert built and why, what inspect found."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from toolkit.runtimes.inspection import ModelInfo
from toolkit.model.quantized import QuantizedShare, label_beyond, precision_label
from toolkit.model.reading import read_record
from toolkit.model.manifest import DOCS, Manifest
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import AttemptOutcome, Precision


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A left-aligned text table with a rule under the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
    return "\n".join(lines)


def human_bytes(count: float) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def _num(value: float | None, fmt: str = "{:.4f}") -> str:
    return "-" if value is None else fmt.format(value)


def convert_table(manifest: Manifest, *, bundle_dir: Path, cached: bool = False) -> str:
    """Every artifact with its size, accuracy and speed against fp32, then the recipes that were dropped."""
    fp32_bytes = {a.format: a.bytes for a in manifest.artifacts if a.precision == Precision.FP32}
    rows = []
    for a in manifest.artifacts:
        v = a.verification
        size = human_bytes(a.bytes)
        if a.format in fp32_bytes and a.precision != Precision.FP32:
            size += f" ({a.bytes / fp32_bytes[a.format]:.2f}x)"
        latency = _num(a.host_latency_ms, "{:.3f} ms")
        if a.fp32_latency_ms and a.precision != Precision.FP32 and a.host_latency_ms:
            latency += f" ({a.host_latency_ms / a.fp32_latency_ms:.2f}x)"
        accuracy = "-"
        if v is not None and v.accuracy is not None:
            accuracy = f"{v.accuracy:.3f} (float {v.reference_accuracy:.3f})"
        elif v is not None and v.top1_agreement is not None:
            accuracy = f"agree {v.top1_agreement:.3f}"
        rows.append([
            a.file + (f" ({label})" if (label := label_beyond(a.precision, a.recipe, a.quantized)) else ""),
            size,
            _num(v.max_abs_error if v else None, "{:.2e}"),
            _num(v.cosine_similarity if v else None),
            accuracy,
            latency,
            a.runtime or "-",
            a.status + (f" ({len(a.float_nodes)} float)" if a.float_nodes else ""),
        ])
    parts = [
        f"bundle {manifest.name} -> {bundle_dir}" + ("  (reused from cache)" if cached else ""),
        f"target {manifest.target.name or '-'}  source {manifest.source.framework}  "
        f"calibration {manifest.calibration.samples if manifest.calibration else 0} samples",
        "",
        table(["artifact", "size", "max err", "cosine", "top-1", "host latency", "runtime", "status"], rows),
    ]
    shares = [(a.file, a.quantized) for a in manifest.artifacts if a.quantized is not None]
    if shares:
        parts += ["", "quantized in substance:"] + [f"  {file}: {share.summary()}" for file, share in shares]
    dropped = [a for a in manifest.attempts if a.outcome != AttemptOutcome.KEPT]
    if dropped:
        parts += ["", "not shipped:"]
        for attempt in dropped:
            label, excluded = attempt.recipe.brief, attempt.recipe.nodes_to_exclude
            if excluded:
                label += f" ({len(excluded)} layers float)"
            parts.append(f"  {label}: {attempt.reason}")
            if attempt.workaround:
                parts.append(f"    workaround: {attempt.workaround}")
    return "\n".join(parts)


def _spec_line(spec: TensorSpec) -> str:
    shape = "(" + ", ".join("?" if d is None else str(d) for d in spec.shape) + ")"
    quant = ""
    if spec.quantization:
        q = spec.quantization
        if len(q.scale) == 1:
            quant = f"  scale={q.scale[0]:.6g} zero_point={q.zero_point[0]}"
        else:
            quant = f"  per-axis({q.axis}) x{len(q.scale)}"
    return f"  {spec.name}  {spec.dtype}  {shape}{quant}"


def inspect_text(info: ModelInfo) -> str:
    share = read_record(QuantizedShare, info.extra["quantized"], docs=DOCS) if info.extra.get("quantized") else None
    lines = [
        f"{info.path}",
        f"  format {info.format}  precision {precision_label(Precision(info.precision), None, share)}"
        f"  size {human_bytes(info.bytes)}"
        + (f"  opset {info.opset}" if info.opset else ""),
        "inputs:",
        *(_spec_line(s) for s in info.inputs),
        "outputs:",
        *(_spec_line(s) for s in info.outputs),
        f"operators ({sum(info.op_counts.values())}; {info.quantized_ops} quantized, "
        f"{info.float_compute_ops} float compute):",
    ]
    lines += [f"  {name:<28} {count}" for name, count in sorted(info.op_counts.items(), key=lambda kv: -kv[1])]
    if share is not None:
        lines.append(f"quantized in substance: {share.summary()}")
    return "\n".join(lines)
