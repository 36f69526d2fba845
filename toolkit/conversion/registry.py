"""Building an artifact through its route (``routes.ROUTES``): refuse a pair or precision that is not offered,
else call the row's builder. ONNX artifacts derive (``onnx_quant.derive``) from one float export per run (the
row's ``float_export``), whatever the source.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.routes import Refusal, resolve, route
from toolkit.errors import UsageError
from toolkit.model.vocabulary import Format

_FP32_EXPORTS: dict[Path, BuiltArtifact] = {}

Builder = Callable[[ConversionRequest, Path], BuiltArtifact]


def supports(framework: str, fmt: str) -> Refusal | None:
    """None when a route exists; else why not and what to do."""
    row = route(framework, fmt)
    if row is None:
        return Refusal(f"There is no route from {framework} to {fmt}.", "Use another --format.")
    return row.refusal if row.builder is None else None


def supports_precision(framework: str, fmt: str, precision: str) -> bool:
    row = route(framework, fmt)
    return row is not None and row.builder is not None and precision not in row.unbuilt


def check_supported(framework: str, fmt: str) -> None:
    refusal = supports(framework, fmt)
    if refusal is not None:
        raise UsageError(refusal.message, hint=refusal.hint)


def fp32_onnx(request: ConversionRequest) -> BuiltArtifact:
    """The float ONNX model for this source, exported once per run into ``request.workdir``."""
    cached = request.workdir / "export.fp32.onnx"
    if cached in _FP32_EXPORTS and cached.is_file():
        return _FP32_EXPORTS[cached]
    row = route(request.source.framework, Format.ONNX)
    if row is None or row.float_export is None:
        raise UsageError(f"No ONNX route from {request.source.framework}.")
    built = cast(Builder, resolve(row.float_export))(request, cached)
    _FP32_EXPORTS[cached] = built
    return built


def derive_onnx(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """An ONNX artifact of any precision, derived from the run's float export."""
    from toolkit.conversion.onnx import quant as onnx_quant

    return onnx_quant.derive(request, fp32_onnx(request), output)


def take_as_is(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """A .tflite source is shipped as it is (its precision is what the file holds)."""
    import shutil

    shutil.copyfile(request.source.path, output)
    return BuiltArtifact(path=output, notes=("taken as it is (no conversion)",))


def build(request: ConversionRequest, output: Path) -> BuiltArtifact:
    framework, fmt = request.source.framework, request.recipe.format
    check_supported(framework, fmt)
    row = route(framework, fmt)
    assert row is not None and row.builder is not None  # check_supported refused every other pair
    refusal = row.a16w8_refusal if request.recipe.a16w8 else None
    if refusal is not None:
        raise UsageError(refusal.message, hint=refusal.hint)
    return cast(Builder, resolve(row.builder))(request, output)
