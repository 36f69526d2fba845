"""A float ``.tflite`` source -> float ONNX through tf2onnx 1.17's TFLite frontend (``from_tflite``).

A ``.tflite`` file is often all a user has (MediaPipe's BlazeFace), and no TFLite tool takes a float file to
full INT8; ONNX Runtime's quantizer does, so ``onnx.quant`` derives the other precisions from this base, each
verified against the ``.tflite`` itself. tf2onnx leaves an op it has no handler for as a ``TFL_*`` node no
runtime loads (MediaPipe's ``Convolution2DTransposeBias``): refused here, naming it. fp16 weights are read
back to float32; an integer-quantized source is refused (its float weights are gone).
"""

from __future__ import annotations

import logging
from pathlib import Path

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.onnx.graph_io import export_opset, save_model
from toolkit.conversion.onnx.from_tf import DEFAULT_OPSET, check_written, rename_io, require_tf2onnx
from toolkit.errors import ConversionError, UsageError, key_line
from toolkit.model.vocabulary import Precision


def unconverted_ops(model: object) -> list[str]:
    """The TFLite operators tf2onnx left in the graph as they were (no ONNX handler), by name, once each."""
    names: list[str] = []
    for node in getattr(model, "graph").node:
        if node.op_type.startswith("TFL_") and node.op_type[4:] not in names:
            names.append(node.op_type[4:])
    return names


def export(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """Write the float ONNX model of a float ``.tflite`` source to ``output`` (opset 17 or ``max_opset``)."""
    from toolkit.sources.tflite import TFLiteSource

    source = request.source
    if not isinstance(source, TFLiteSource):
        raise UsageError(f"The TFLite -> ONNX route takes .tflite sources, not {source.framework}.")
    if source.precision not in (Precision.FP32, Precision.FP16):  # fp16 weights are dequantized to float32 in the graph
        raise UsageError(
            f"The TFLite source {source.path.name} is already quantized ({source.precision}): ONNX artifacts are "
            "built only from a float .tflite model.",
            hint="Pass the float .tflite file (or the original Keras/SavedModel/PyTorch model), or use "
            "--format tflite to ship this file as it is.",
        )
    tf2onnx = require_tf2onnx("Converting a TFLite model to ONNX")
    opset = export_opset(request, DEFAULT_OPSET)
    quiet = logging.getLogger("tf2onnx")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # it logs every unsupported op as an error; the refusal below says it once
    try:
        proto, _ = tf2onnx.convert.from_tflite(str(source.path), opset=opset)
    except Exception as exc:  # noqa: BLE001 - tf2onnx raises any type; reported as one plain line
        raise ConversionError(
            f"tf2onnx could not convert {source.path.name} to ONNX: {key_line(exc)}",
            hint="Use --format tflite to ship the file as it is, or convert from the original model.",
        ) from None
    finally:
        quiet.setLevel(level)
    missing = unconverted_ops(proto)
    if missing:
        raise ConversionError(
            f"{source.path.name} uses the TFLite custom operator(s) {', '.join(missing)}, which tf2onnx "
            f"{tf2onnx.__version__} cannot convert to ONNX.",
            hint="Ship it as TFLite (--format tflite) on a runtime that has the operator registered (MediaPipe's "
            "own interpreter for its custom ops), or export the original model without the custom op.",
        )
    ins, outs = [v.name for v in proto.graph.input], [v.name for v in proto.graph.output]
    want_in, want_out = [s.name for s in source.inputs], [s.name for s in source.outputs]
    if sorted(ins) != sorted(want_in) or sorted(outs) != sorted(want_out):
        rename_io(proto, want_in, want_out)
    check_written(proto)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    save_model(proto, output, final_name=output.name)
    return BuiltArtifact(path=Path(output), exporter=f"tf2onnx {tf2onnx.__version__} (from_tflite)",
                         notes=(f"opset {opset}", "float ONNX base converted from the .tflite source"))
