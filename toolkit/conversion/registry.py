"""Which route builds which artifact: (source framework, artifact format) -> route.

ONNX artifacts are built in two steps: the source's own exporter writes a float ONNX model once per run
(shared by every precision), then ``onnx_quant`` derives fp16 / dynamic / int8 from it, whatever the source.
"""

from __future__ import annotations

from pathlib import Path

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.errors import UsageError

TF_FRAMEWORKS = ("keras", "savedmodel")
TORCH_FRAMEWORKS = ("torchscript", "exported_program", "torch_factory")

# One float export per run directory: every ONNX precision of a run derives from the same file.
_FP32_EXPORTS: dict[Path, BuiltArtifact] = {}


def check_supported(framework: str, fmt: str) -> None:
    """Refuse, before any work, a route that is not offered."""
    if framework == "onnx" and fmt == "tflite":
        raise UsageError(
            "Converting ONNX to TFLite is not offered: the available tools (onnx2tf) pin an old TensorFlow and "
            "rewrite the graph in ways that cannot be verified well.",
            hint="Convert from the original framework instead (Keras/SavedModel or PyTorch -> --format tflite), "
            "or ask for --format onnx.",
        )
    if framework == "tflite" and fmt == "onnx":
        raise UsageError(
            "A .tflite source is taken as it is; it cannot be turned into ONNX.",
            hint="Convert from the original framework for ONNX, or use --format tflite.",
        )


def fp32_onnx(request: ConversionRequest) -> BuiltArtifact:
    """The float ONNX model for this source, exported once per run into ``request.workdir``."""
    cached = request.workdir / "export.fp32.onnx"
    if cached in _FP32_EXPORTS and cached.is_file():
        return _FP32_EXPORTS[cached]
    framework = request.source.framework
    if framework == "onnx":
        from toolkit.conversion import onnx_quant

        built = onnx_quant.prepare(request, cached)
    elif framework in TF_FRAMEWORKS:
        from toolkit.conversion import tf_onnx

        built = tf_onnx.export(request, cached)
    elif framework in TORCH_FRAMEWORKS:
        from toolkit.conversion import torch_onnx

        built = torch_onnx.export(request, cached)
    else:
        raise UsageError(f"No ONNX route from {framework}.")
    _FP32_EXPORTS[cached] = built
    return built


def build(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """Build ``request.recipe``'s artifact at ``output``."""
    framework, fmt = request.source.framework, request.recipe.format
    check_supported(framework, fmt)
    if fmt == "onnx":
        from toolkit.conversion import onnx_quant

        base = fp32_onnx(request)
        return onnx_quant.derive(request, base, output)
    if framework in TF_FRAMEWORKS:
        from toolkit.conversion import tflite

        return tflite.convert(request, output)
    if framework in TORCH_FRAMEWORKS:
        from toolkit.conversion import torch_tflite

        return torch_tflite.convert(request, output)
    raise UsageError(f"No route from {framework} to {fmt}.")
