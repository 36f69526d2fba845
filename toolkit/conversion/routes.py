"""Every conversion route as data: one :class:`Route` row per (source framework, artifact format).

A row names its backend (``backend.Backend``: what builds the artifact and what the convert walk asks of its
format) or its refusal, the precisions it refuses, and whether it is a default format. A backend is a
``"module:NAME"`` string imported only when used (``backend.backend_for``), so reading the table costs nothing
(``edgetk --help`` stays light). A new route is one row naming a backend; a new format is one backend package and
its rows; ``tests/conversion/test_registry.py`` proves every built route has a conversion test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from toolkit.errors import UsageError
from toolkit.model.vocabulary import FORMATS, Format, Framework, Precision


@dataclass(frozen=True)
class Refusal:
    message: str
    hint: str


@dataclass(frozen=True)
class Route:
    """One (framework, format) pair: built (``backend``) or refused (``refusal``)."""

    framework: Framework
    format: Format
    backend: str | None = None  # "module:NAME" of its backend.Backend
    refusal: Refusal | None = None  # a pair not offered: why, and the route to use instead
    default: bool = False  # built when neither --format nor the profile names a format
    unbuilt: tuple[Precision, ...] = ()  # refused by design (the backend raises a UsageError saying why)
    a16w8_refusal: Refusal | None = None  # the route builds 8-bit activations only


TF = (Framework.KERAS, Framework.SAVEDMODEL)
TORCH_EXPORT = (Framework.EXPORTED_PROGRAM, Framework.TORCH_FACTORY)  # what torch.export takes
TORCH = (Framework.TORCHSCRIPT, *TORCH_EXPORT)

_NO_FP16_DYNAMIC = (Precision.FP16, Precision.DYNAMIC)
_PTE_ONLY_TORCH = Refusal(
    "ExecuTorch (.pte) artifacts are built from PyTorch models only: the route is torch.export -> ExecuTorch "
    "(XNNPACK), and this source is not a PyTorch module.",
    "Pass the PyTorch factory (file.py:make_model) or an ExportedProgram (.pt2) for --format pte, or use "
    "--format tflite / onnx for this source.",
)
_ONNX = "toolkit.conversion.onnx.backend"
_ONNX_BACKENDS: Mapping[Framework, str] = {  # each exports its source as float ONNX its own way
    Framework.ONNX: f"{_ONNX}:FROM_ONNX", **{fw: f"{_ONNX}:FROM_TF" for fw in TF},
    **{fw: f"{_ONNX}:FROM_TORCH" for fw in TORCH}, Framework.TFLITE: f"{_ONNX}:FROM_TFLITE",
}

_ROWS: tuple[Route, ...] = (
    *(Route(fw, Format.TFLITE, "toolkit.conversion.tflite.backend:KERAS", default=True) for fw in TF),
    *(Route(fw, Format.TFLITE, "toolkit.conversion.pt2e.backend:LITERT", unbuilt=_NO_FP16_DYNAMIC,
            a16w8_refusal=Refusal(
                "PyTorch -> TFLite (litert-torch, PT2E) quantizes activations to 8 bits only: it cannot build A16W8.",
                "Use --format onnx for A16W8 (16-bit activation QDQ through ONNX Runtime), or convert a "
                "Keras/SavedModel model for an A16W8 TFLite artifact."))
      for fw in TORCH_EXPORT),
    Route(Framework.TFLITE, Format.TFLITE, "toolkit.conversion.tflite.backend:AS_IS", default=True),
    *(Route(fw, Format.PTE, "toolkit.conversion.executorch.backend:EXECUTORCH", unbuilt=(Precision.DYNAMIC,),
            a16w8_refusal=Refusal(
                "PyTorch -> ExecuTorch (XNNPACK quantizer) quantizes activations to 8 bits only: it cannot build "
                "A16W8.", "Use --format onnx for A16W8 (16-bit activation QDQ through ONNX Runtime)."))
      for fw in TORCH_EXPORT),
    *(Route(fw, Format.ONNX, backend, default=fw != Framework.TFLITE) for fw, backend in _ONNX_BACKENDS.items()),
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
    rows = [r for r in _ROWS if r.framework == framework and r.default and r.backend]
    return tuple(sorted((r.format for r in rows), key=FORMATS.index))


def supports(framework: str, fmt: str) -> Refusal | None:
    """None when a route exists; else why not and what to do."""
    row = route(framework, fmt)
    if row is None:
        return Refusal(f"There is no route from {framework} to {fmt}.", "Use another --format.")
    return row.refusal if row.backend is None else None


def supports_precision(framework: str, fmt: str, precision: str) -> bool:
    row = route(framework, fmt)
    return row is not None and row.backend is not None and precision not in row.unbuilt


def check_supported(framework: str, fmt: str) -> Route:
    """The row of a pair that is built; a ``UsageError`` saying why not and what to use for any other."""
    refusal = supports(framework, fmt)
    if refusal is not None:
        raise UsageError(refusal.message, hint=refusal.hint)
    row = route(framework, fmt)
    assert row is not None  # supports refused every pair without a row
    return row
