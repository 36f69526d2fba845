"""PyTorch -> float ONNX with ``torch.onnx.export``; ``onnx.quant`` derives the other precisions.

The current exporter (``dynamo=True``) is tried first for eager modules and ExportedPrograms: one
self-contained file, batch fixed or dynamic (``request.dynamic_batch``). The legacy TorchScript exporter
(``dynamo=False``, named in ``BuiltArtifact.exporter`` and the notes) is used for TorchScript modules (the
current one refuses them), when the current one fails (reason recorded), or when the target's highest opset is
below 18: the current exporter down-converts with the ONNX version converter, which fails on many graphs
(``Assertion node->hasAttribute(kaxes)``, findings.md) and then silently keeps 18, so the written opset is
checked, never assumed. Opset: ``recipe.opset``, else 18, capped by ``request.max_opset``. Inputs keep the
source's names; outputs are named like the source's (``output`` or ``output_0``, ...).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.onnx.graph_io import export_opset, opset_of
from toolkit.errors import ConversionError, MissingDependency, UsageError, key_line
from toolkit.model.vocabulary import Framework
from toolkit.sources.torch import TorchSource, import_torch, missing_shape_error, output_names

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor, nn

DEFAULT_OPSET = 18
_BATCH_MAX = 65536
_QUIET_LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "onnx_ir", "torch.fx")


def export(request: ConversionRequest, output: Path) -> BuiltArtifact:
    source = _torch_source(request)
    torch = import_torch("Exporting a PyTorch model to ONNX")
    _require_onnxscript()
    shapes = _input_shapes(request, source)
    opset = export_opset(request, DEFAULT_OPSET)
    args = example_args(torch, source, request, shapes)
    names = [spec.name for spec in source.inputs]
    outputs = list(output_names(len(source.probe_outputs(shapes))))
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.stem + ".partial.onnx")

    notes: list[str] = []
    current_error: str | None = None
    if source.framework == Framework.TORCHSCRIPT:
        notes.append(
            "TorchScript source: exported with the legacy TorchScript exporter (the current exporter "
            "takes only nn.Module and ExportedProgram)."
        )
    else:
        module = source.module
        try:
            _export(torch, module, args, tmp, names, outputs, opset, request.dynamic_batch, dynamo=True)
            written = opset_of(tmp)
            if written <= opset:
                _finish(tmp, output)
                return BuiltArtifact(
                    path=output,
                    exporter=f"torch.onnx {_version(torch)} (dynamo exporter, opset {written})",
                    notes=tuple(notes),
                )
            current_error = (
                f"the current exporter cannot write opset {opset} for this model (it kept opset {written}; "
                "the ONNX version converter failed)"
            )
        except Exception as exc:  # noqa: BLE001  (the exporter raises many types; reported, then the fallback)
            current_error = f"the current exporter failed: {_exporter_reason(exc)}"
        _cleanup(tmp)
        if source.framework == Framework.EXPORTED_PROGRAM:
            raise ConversionError(
                f"Cannot export the ExportedProgram {str(source.path)!r} to ONNX opset {opset}: {current_error}.",
                hint=_op_hint(current_error)
                or "The legacy exporter cannot take an ExportedProgram; pass the "
                "factory (file.py:make_model) or a TorchScript file instead, or a target whose ONNX runtime "
                "loads opset 18.",
            )
        notes.append(f"Legacy TorchScript exporter used: {current_error}.")

    try:
        _export(torch, source.module, args, tmp, names, outputs, opset, request.dynamic_batch, dynamo=False)
    except Exception as exc:
        _cleanup(tmp)
        raise _legacy_failed(exc, current_error, opset, source) from exc
    written = opset_of(tmp)
    _finish(tmp, output)
    return BuiltArtifact(
        path=output,
        exporter=f"torch.onnx {_version(torch)} (legacy TorchScript exporter, opset {written})",
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------------------------- helpers


def _require_onnxscript() -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401  (the current exporter needs it)
    except ImportError as exc:
        raise MissingDependency(
            getattr(exc, "name", None) or "onnxscript",
            extra="onnx",
            purpose="Exporting a PyTorch model to ONNX",
        ) from exc


def _legacy_failed(exc: BaseException, current_error: str | None, opset: int, source: TorchSource) -> ConversionError:
    """The error when the legacy exporter failed too: the op no exporter handles, when one is named."""
    legacy = _exporter_reason(exc)
    op = _unsupported_op(legacy) or _unsupported_op(current_error or "")
    reasons = f"{current_error}; the legacy exporter failed: {legacy}" if current_error else legacy
    if op:
        return ConversionError(
            f"No ONNX exporter handles the PyTorch op {op} (opset {opset}): {reasons}",
            hint=f"Replace {op} in the model with ops ONNX supports, or register a custom ONNX function "
            "for it (torch.onnx.export(custom_translation_table=...)).",
        )
    return ConversionError(
        f"Exporting {str(source.path)!r} to ONNX failed: {reasons}",
        hint="Run with --debug for the exporter's traceback.",
    )


def _torch_source(request: ConversionRequest) -> TorchSource:
    source = request.source
    if not isinstance(source, TorchSource):
        raise UsageError(f"The PyTorch ONNX route got a {source.framework} source.")
    return source


def _input_shapes(request: ConversionRequest, source: TorchSource) -> dict[str, tuple[int, ...]]:
    missing = [spec.name for spec in source.inputs if spec.name not in request.input_shapes]
    if missing:
        raise missing_shape_error(source, missing)
    return {
        name: tuple(int(d) for d in request.input_shapes[name]) for name in (s.name for s in source.inputs)
    }


def example_args(
    torch: ModuleType, source: TorchSource, request: ConversionRequest, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[Tensor, ...]:
    """Tracing inputs: the first calibration sample when there is one (real values keep data-dependent paths
    honest), else seeded random data; with a dynamic batch, batch 2 (a batch of 1 is specialised by export)."""
    rng = np.random.default_rng(0)
    tensors = []
    for spec in source.inputs:
        shape = shapes[spec.name]
        dtype = np.dtype(spec.dtype)
        if request.calibration and spec.name in request.calibration[0]:
            value = np.asarray(request.calibration[0][spec.name]).astype(dtype).reshape(shape)
        elif np.issubdtype(dtype, np.integer):
            value = np.zeros(shape, dtype=dtype)
        else:
            value = rng.random(shape, dtype=np.float32).astype(dtype)
        if request.dynamic_batch and value.shape and value.shape[0] == 1:
            value = np.concatenate([value, value], axis=0)
        tensors.append(torch.from_numpy(np.ascontiguousarray(value)))
    return tuple(tensors)


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """Exporters print progress to stdout and warn at length; keep stdout clean for ``--json`` and move the
    chatter to stderr at ERROR level only."""
    levels = {name: logging.getLogger(name).level for name in _QUIET_LOGGERS}
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _export(
    torch: ModuleType, module: nn.Module, args: tuple[Tensor, ...], path: Path, names: list[str], outputs: list[str],
    opset: int, dynamic_batch: bool, *, dynamo: bool,
) -> None:
    """``torch.onnx.export`` with the current exporter (``dynamo``) or the legacy TorchScript one; a dynamic
    batch is ``dynamic_shapes`` for the first, ``dynamic_axes`` for the second."""
    options: dict[str, object]  # the exporters' own keyword arguments
    if dynamo:
        batch = torch.export.Dim("batch", min=1, max=_BATCH_MAX) if dynamic_batch else None
        options = {"external_data": False, "verbose": False,
                   "dynamic_shapes": tuple({0: batch} for _ in args) if dynamic_batch else None}
    else:
        options = {"do_constant_folding": True,
                   "dynamic_axes": {name: {0: "batch"} for name in [*names, *outputs]} if dynamic_batch else None}
    with quiet_export():
        torch.onnx.export(module, args, str(path), dynamo=dynamo, opset_version=opset, input_names=names,
                          output_names=outputs, **options)


def _finish(tmp: Path, output: Path) -> None:
    """Drop the exporter's intermediate ``value_info`` and move the file into place (no ``.data`` beside it):
    ``quantize_dynamic`` rewrites MatMuls and then fails shape inference against those stale entries on a
    transformer ("Inferred shape and existing shape differ in dimension 0: (32) vs (10)"); onnxruntime infers
    them again on load."""
    import onnx

    model = onnx.load(str(tmp))
    del model.graph.value_info[:]
    onnx.save(model, str(tmp))
    os.replace(tmp, output)
    for stray in (Path(str(tmp) + ".data"), Path(str(output) + ".data")):
        stray.unlink(missing_ok=True)


def _cleanup(tmp: Path) -> None:
    tmp.unlink(missing_ok=True)
    Path(str(tmp) + ".data").unlink(missing_ok=True)


def _version(torch: ModuleType) -> str:
    return str(torch.__version__).split("+")[0]


_DYNAMO_OP = re.compile(r"No ONNX function found for <OpOverload\(op='([\w.]+)'")
_LEGACY_OP = re.compile(r"operator '([\w:.]+)' to ONNX opset")
_SUMMARY = re.compile(r"<class '[\w.]+'>: (.+)")


def _unsupported_op(text: str) -> str | None:
    for pattern in (_LEGACY_OP, _DYNAMO_OP):
        match = pattern.search(text)
        if match:
            op = match.group(1)
            return op.replace("aten.", "aten::", 1) if op.startswith("aten.") else op
    return None


def _op_hint(text: str | None) -> str | None:
    op = _unsupported_op(text or "")
    return f"Replace {op} in the model with ops ONNX supports." if op else None


def _exporter_reason(exc: BaseException) -> str:
    """The useful line of an exporter error: the exception summary of the current exporter's report, or the
    first line of anything else."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if "Exception summary" in text:
        summary = text.split("Exception summary", 1)[1]
        match = _SUMMARY.search(summary)
        if match:
            return match.group(1).strip()[:500]
    return key_line(exc)
