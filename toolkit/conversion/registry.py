"""Which route builds which artifact: a declarative table ``(source framework, format) -> "module:function"``.

ONNX artifacts are built in two steps: the source's own exporter (``FLOAT_EXPORTS``) writes a float ONNX
model once per run (shared by every precision), then ``onnx_quant.derive`` builds fp16 / dynamic / int8
from it, whatever the source. A pair that is not offered has a ``REFUSED`` entry (the message and the route
to use instead); a pair in neither table has no route. Modules are imported only when a route is used, so
reading the table costs nothing. ``tests/conversion/test_registry.py`` proves every route has a conversion
test.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.errors import UsageError

TF_FRAMEWORKS = ("keras", "savedmodel")
TORCH_FRAMEWORKS = ("torchscript", "exported_program", "torch_factory")

# (framework, format) -> "module:function(request, output) -> BuiltArtifact"
ROUTES: Mapping[tuple[str, str], str] = {
    **{(fw, "tflite"): "toolkit.conversion.tflite:convert" for fw in TF_FRAMEWORKS},
    **{(fw, "tflite"): "toolkit.conversion.torch_tflite:convert" for fw in ("exported_program", "torch_factory")},
    ("tflite", "tflite"): "toolkit.conversion.registry:take_as_is",
    **{(fw, "pte"): "toolkit.conversion.torch_pte:convert" for fw in ("exported_program", "torch_factory")},
    **{(fw, "onnx"): "toolkit.conversion.registry:derive_onnx"
       for fw in (*TF_FRAMEWORKS, *TORCH_FRAMEWORKS, "onnx", "tflite")},
}

# framework -> "module:function(request, output) -> BuiltArtifact": the float ONNX model every ONNX artifact
# derives from.
FLOAT_EXPORTS: Mapping[str, str] = {
    "onnx": "toolkit.conversion.onnx_prepare:prepare",
    **{fw: "toolkit.conversion.tf_onnx:export" for fw in TF_FRAMEWORKS},
    **{fw: "toolkit.conversion.torch_onnx:export" for fw in TORCH_FRAMEWORKS},
    "tflite": "toolkit.conversion.tflite_onnx:export",  # tf2onnx's TFLite frontend (float sources only)
}

# precisions a route refuses by design (the route module raises a UsageError saying why and what to use)
UNBUILT_PRECISIONS: Mapping[tuple[str, str], tuple[str, ...]] = {
    **{(fw, fmt): ("fp16", "dynamic") for fw in ("exported_program", "torch_factory") for fmt in ("tflite", "pte")},
}


@dataclass(frozen=True)
class Refusal:
    message: str
    hint: str


_PTE_ONLY_TORCH = Refusal(
    "ExecuTorch (.pte) artifacts are built from PyTorch models only: the route is torch.export -> ExecuTorch "
    "(XNNPACK), and this source is not a PyTorch module.",
    "Pass the PyTorch factory (file.py:make_model) or an ExportedProgram (.pt2) for --format pte, or use "
    "--format tflite / onnx for this source.",
)

REFUSED: Mapping[tuple[str, str], Refusal] = {
    **{(fw, "pte"): _PTE_ONLY_TORCH for fw in (*TF_FRAMEWORKS, "onnx", "tflite")},
    ("torchscript", "pte"): Refusal(
        "TorchScript cannot go to ExecuTorch (.pte): the route traces with torch.export, which does not take "
        "ScriptModules.",
        "Pass the factory (file.py:make_model) or an ExportedProgram (.pt2) for --format pte, or use --format onnx.",
    ),
    ("onnx", "tflite"): Refusal(
        "Converting ONNX to TFLite is not offered: the available tools (onnx2tf) pin an old TensorFlow and "
        "rewrite the graph in ways that cannot be verified well.",
        "Convert from the original framework instead (Keras/SavedModel or PyTorch -> --format tflite), "
        "or ask for --format onnx.",
    ),
    ("torchscript", "tflite"): Refusal(
        "TorchScript cannot go to TFLite: litert-torch traces with torch.export, which does not take "
        "ScriptModules.",
        "Pass the factory (file.py:make_model) or an ExportedProgram (.pt2) for --format tflite, or use "
        "--format onnx.",
    ),
}

# One float export per run directory: every ONNX precision of a run derives from the same file.
_FP32_EXPORTS: dict[Path, BuiltArtifact] = {}

Route = Callable[[ConversionRequest, Path], BuiltArtifact]


def resolve(spec: str) -> Route:
    """``"package.module:function"`` -> the function (imports the module)."""
    module, _, name = spec.partition(":")
    function: Any = getattr(importlib.import_module(module), name)
    return function


def supports(framework: str, fmt: str) -> Refusal | None:
    """None when a route exists; else why not and what to do."""
    if (framework, fmt) in ROUTES:
        return None
    return REFUSED.get((framework, fmt), Refusal(f"There is no route from {framework} to {fmt}.",
                                                 "Use another --format."))


def supports_precision(framework: str, fmt: str, precision: str) -> bool:
    return supports(framework, fmt) is None and precision not in UNBUILT_PRECISIONS.get((framework, fmt), ())


def check_supported(framework: str, fmt: str) -> None:
    """Refuse, before any work, a route that is not offered."""
    refusal = supports(framework, fmt)
    if refusal is not None:
        raise UsageError(refusal.message, hint=refusal.hint)


def fp32_onnx(request: ConversionRequest) -> BuiltArtifact:
    """The float ONNX model for this source, exported once per run into ``request.workdir``."""
    cached = request.workdir / "export.fp32.onnx"
    if cached in _FP32_EXPORTS and cached.is_file():
        return _FP32_EXPORTS[cached]
    spec = FLOAT_EXPORTS.get(request.source.framework)
    if spec is None:
        raise UsageError(f"No ONNX route from {request.source.framework}.")
    built = resolve(spec)(request, cached)
    _FP32_EXPORTS[cached] = built
    return built


def derive_onnx(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """An ONNX artifact of any precision, derived from the run's float export."""
    from toolkit.conversion import onnx_quant

    return onnx_quant.derive(request, fp32_onnx(request), output)


def take_as_is(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """A .tflite source is shipped as it is (its precision is what the file holds)."""
    import shutil

    shutil.copyfile(request.source.path, output)
    return BuiltArtifact(path=output, notes=("taken as it is (no conversion)",))


# routes that build 8-bit activations only: an A16W8 recipe (16-bit activations) is refused, naming the route that can
A16W8_REFUSED: Mapping[tuple[str, str], Refusal] = {
    **{(fw, "tflite"): Refusal(
        "PyTorch -> TFLite (litert-torch, PT2E) quantizes activations to 8 bits only: it cannot build A16W8.",
        "Use --format onnx for A16W8 (16-bit activation QDQ through ONNX Runtime), or convert a Keras/SavedModel "
        "model for an A16W8 TFLite artifact.") for fw in ("exported_program", "torch_factory")},
    **{(fw, "pte"): Refusal(
        "PyTorch -> ExecuTorch (XNNPACK quantizer) quantizes activations to 8 bits only: it cannot build A16W8.",
        "Use --format onnx for A16W8 (16-bit activation QDQ through ONNX Runtime).")
       for fw in ("exported_program", "torch_factory")},
}


def build(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """Build ``request.recipe``'s artifact at ``output`` through its route."""
    key = (request.source.framework, request.recipe.format)
    check_supported(*key)
    refusal = A16W8_REFUSED.get(key) if request.recipe.a16w8 else None
    if refusal is not None:
        raise UsageError(refusal.message, hint=refusal.hint)
    return resolve(ROUTES[key])(request, output)
