"""Read what is inside an artifact without running it: I/O, quantization, operator counts, size."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from toolkit.errors import UsageError
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import Format, Precision


@dataclass(frozen=True)
class ModelInfo:
    """What ``edgetk inspect`` prints for one model file.

    ``quantized_ops`` counts operators that compute in integer (TFLite ops with int8/uint8/int16 inputs
    other than QUANTIZE/DEQUANTIZE; ONNX QLinear*/ConvInteger/MatMulInteger/QDQ-wrapped compute nodes),
    in every subgraph, so an ``int8`` label can be proven rather than assumed.
    """

    path: str
    format: Format
    bytes: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    op_counts: Mapping[str, int]
    quantized_ops: int
    float_compute_ops: int
    precision: Precision  # best guess from the content
    opset: int | None = None
    extra: Mapping[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "format": self.format,
            "bytes": self.bytes,
            "precision": self.precision,
            "opset": self.opset,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "op_counts": dict(sorted(self.op_counts.items())),
            "quantized_ops": self.quantized_ops,
            "float_compute_ops": self.float_compute_ops,
            "extra": dict(self.extra),
        }


def inspect_model(path: Path) -> ModelInfo:
    suffix = path.suffix.lower()
    if suffix == ".tflite":
        from toolkit.runtimes.inspection.tflite import inspect_tflite

        return _with_share(inspect_tflite(path))
    if suffix == ".onnx":
        from toolkit.runtimes.inspection.onnx import inspect_onnx

        return _with_share(inspect_onnx(path))
    if suffix == ".pte":
        from toolkit.runtimes.inspection.pte import inspect_pte

        return inspect_pte(path)
    raise UsageError(f"{path} is not a .tflite, .onnx or .pte file.", hint="Pass an artifact or a bundle directory.")


def _with_share(info: ModelInfo) -> ModelInfo:
    """A quantized model's info with ``extra["quantized"]``: its share of weights/MACs in integer."""
    import dataclasses

    from toolkit.runtimes.inspection.share import artifact_share

    share = artifact_share(Path(info.path), info.precision, (), ())
    return dataclasses.replace(info, extra={**info.extra, "quantized": share.to_dict()}) if share else info
