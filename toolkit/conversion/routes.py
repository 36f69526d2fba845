"""Every conversion route as data: one :class:`Route` row per (source framework, artifact format).

A row names its builder or its refusal, the precisions it refuses, whether it is a default format, and its
format backend (float ONNX export, layer table). Functions are ``"module:function"`` strings imported only when
used (``resolve``), so reading the table costs nothing (``edgetk --help`` stays light). A new route is one row
plus its module; ``tests/conversion/test_registry.py`` proves every built route has a conversion test.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from toolkit.model.vocabulary import FORMATS, Format, Framework, Precision


@dataclass(frozen=True)
class Refusal:
    message: str
    hint: str


@dataclass(frozen=True)
class Route:
    """One (framework, format) pair: built (``builder``) or refused (``refusal``)."""

    framework: Framework
    format: Format
    builder: str | None = None  # "module:function(request, output) -> BuiltArtifact"
    refusal: Refusal | None = None  # a pair not offered: why, and the route to use instead
    default: bool = False  # built when neither --format nor the profile names a format
    unbuilt: tuple[Precision, ...] = ()  # refused by design (the builder raises a UsageError saying why)
    a16w8_refusal: Refusal | None = None  # the route builds 8-bit activations only
    float_export: str | None = None  # ONNX: "module:function(request, output) -> BuiltArtifact", the float model
    layer_table: str | None = None  # "module:function(request, full) -> LayerTable" of its full INT8 recipe


TF = (Framework.KERAS, Framework.SAVEDMODEL)
TORCH_EXPORT = (Framework.EXPORTED_PROGRAM, Framework.TORCH_FACTORY)  # what torch.export takes
TORCH = (Framework.TORCHSCRIPT, *TORCH_EXPORT)

_PT2E_TABLE = "toolkit.conversion.layers:pt2e_table"
_NO_FP16_DYNAMIC = (Precision.FP16, Precision.DYNAMIC)
_PTE_ONLY_TORCH = Refusal(
    "ExecuTorch (.pte) artifacts are built from PyTorch models only: the route is torch.export -> ExecuTorch "
    "(XNNPACK), and this source is not a PyTorch module.",
    "Pass the PyTorch factory (file.py:make_model) or an ExportedProgram (.pt2) for --format pte, or use "
    "--format tflite / onnx for this source.",
)
_FLOAT_EXPORTS: Mapping[Framework, str] = {
    Framework.ONNX: "toolkit.conversion.onnx.prepare:prepare",
    **{fw: "toolkit.conversion.onnx.from_tf:export" for fw in TF},
    **{fw: "toolkit.conversion.onnx.from_torch:export" for fw in TORCH},
    Framework.TFLITE: "toolkit.conversion.onnx.from_tflite:export",  # tf2onnx's TFLite frontend (float sources only)
}

_ROWS: tuple[Route, ...] = (
    *(Route(fw, Format.TFLITE, "toolkit.conversion.tflite.convert:convert", default=True,
            layer_table="toolkit.conversion.layers:tflite_table") for fw in TF),
    *(Route(fw, Format.TFLITE, "toolkit.conversion.pt2e.litert:convert", unbuilt=_NO_FP16_DYNAMIC,
            layer_table=_PT2E_TABLE, a16w8_refusal=Refusal(
                "PyTorch -> TFLite (litert-torch, PT2E) quantizes activations to 8 bits only: it cannot build A16W8.",
                "Use --format onnx for A16W8 (16-bit activation QDQ through ONNX Runtime), or convert a "
                "Keras/SavedModel model for an A16W8 TFLite artifact."))
      for fw in TORCH_EXPORT),
    Route(Framework.TFLITE, Format.TFLITE, "toolkit.conversion.registry:take_as_is", default=True),
    *(Route(fw, Format.PTE, "toolkit.conversion.executorch.convert:convert", unbuilt=(Precision.DYNAMIC,),
            layer_table=_PT2E_TABLE, a16w8_refusal=Refusal(
                "PyTorch -> ExecuTorch (XNNPACK quantizer) quantizes activations to 8 bits only: it cannot build "
                "A16W8.", "Use --format onnx for A16W8 (16-bit activation QDQ through ONNX Runtime)."))
      for fw in TORCH_EXPORT),
    *(Route(fw, Format.ONNX, "toolkit.conversion.registry:derive_onnx", default=fw != Framework.TFLITE,
            float_export=export, layer_table="toolkit.conversion.layers:onnx_full_table")
      for fw, export in _FLOAT_EXPORTS.items()),
    *(Route(fw, Format.PTE, refusal=_PTE_ONLY_TORCH) for fw in (*TF, Framework.ONNX, Framework.TFLITE)),
    Route(Framework.TORCHSCRIPT, Format.PTE, refusal=Refusal(
        "TorchScript cannot go to ExecuTorch (.pte): the route traces with torch.export, which does not take "
        "ScriptModules.",
        "Pass the factory (file.py:make_model) or an ExportedProgram (.pt2) for --format pte, or use --format onnx.",
    )),
    Route(Framework.ONNX, Format.TFLITE, refusal=Refusal(
        "Converting ONNX to TFLite is not offered: the available tools (onnx2tf) pin an old TensorFlow and "
        "rewrite the graph in ways that cannot be verified well.",
        "Convert from the original framework instead (Keras/SavedModel or PyTorch -> --format tflite), "
        "or ask for --format onnx.",
    )),
    Route(Framework.TORCHSCRIPT, Format.TFLITE, refusal=Refusal(
        "TorchScript cannot go to TFLite: litert-torch traces with torch.export, which does not take "
        "ScriptModules.",
        "Pass the factory (file.py:make_model) or an ExportedProgram (.pt2) for --format tflite, or use "
        "--format onnx.",
    )),
)

ROUTES: Mapping[tuple[str, str], Route] = {(r.framework, r.format): r for r in _ROWS}


def route(framework: str, fmt: str) -> Route | None:
    """The row of (framework, format); None: no route and no refusal written for the pair."""
    return ROUTES.get((framework, fmt))


def default_formats(framework: str) -> tuple[Format, ...]:
    """The formats built when neither ``--format`` nor the profile names one, in ``FORMATS`` order."""
    rows = [r for r in _ROWS if r.framework == framework and r.default and r.builder]
    return tuple(sorted((r.format for r in rows), key=FORMATS.index))


def resolve(spec: str) -> Callable[..., object]:
    """``"package.module:function"`` -> the function (imports the module)."""
    module, _, name = spec.partition(":")
    return cast("Callable[..., object]", getattr(importlib.import_module(module), name))
