"""PyTorch -> TFLite through ``litert-torch`` (Google's route; ``ai-edge-torch`` is its deprecated alias).

- ``fp32``: ``litert_torch.convert`` of the eager module (or the ExportedProgram's module).
- ``int8``: PT2E static quantization (``pt2e.quantize``) calibrated on ``request.calibration``; the artifact takes
  and returns int8 tensors. Layers of ``recipe.nodes_to_exclude`` and the known-fragile nodes
  (``pt2e.fragile``) stay float; an output a mixed-range cat writes stays float32 even with int8 I/O
  (``FloatIO`` reason ``MIXED_RANGES``: one int8 scale would collapse the scores again).
- ``dynamic`` and ``fp16`` are refused: PT2E dynamic quantization gave a broken model (accuracy 0.06 on digits,
  already wrong in the torch graph: findings.md), and litert-torch has no fp16 weight path. The ONNX route
  builds both.

Layout: with ``recipe.layout == "NHWC"`` 4-D inputs are made channel-last by a wrapper that keeps their names
(``litert_torch.to_channel_last_io``'s positional wrapper loses them); outputs keep the model's layout.
TorchScript modules cannot be traced by ``torch.export``: refused, naming the route to use. Without the
``litert-torch`` extra the route raises MissingDependency. ``Any``: torch and litert-torch objects (lazy imports).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolkit.conversion.pt2e import quantize as pt2e
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.pt2e.fragile import MixedOutput
from toolkit.errors import ConversionError, MissingDependency, UsageError, key_line
from toolkit.model.artifact import FloatIO
from toolkit.model.vocabulary import FloatIOReason, Framework, IoDtype, Layout, Precision, TensorRole
from toolkit.sources.torch import TorchSource, import_torch, missing_shape_error

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from toolkit.model.tensors import TensorSpec

_PURPOSE = "Converting a PyTorch model to TFLite"


def convert(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """Build ``request.recipe`` (fp32 or int8) as a .tflite file at ``output``."""
    source = _refuse_unbuilt(request)
    precision = request.recipe.precision
    litert_torch = _import_litert_torch()
    torch = import_torch(_PURPOSE)
    missing = [spec.name for spec in source.inputs if spec.name not in request.input_shapes]
    if missing:
        raise missing_shape_error(source, missing)
    if request.dynamic_batch:
        raise UsageError(
            "A dynamic batch is not offered for TFLite artifacts from PyTorch; TFLite models here run batch 1.",
            hint="Drop the dynamic batch for --format tflite, or use --format onnx.",
        )
    shapes = {spec.name: tuple(int(d) for d in request.input_shapes[spec.name]) for spec in source.inputs}
    args, names = pt2e.inputs(torch, request)
    nhwc = request.recipe.layout == Layout.NHWC
    if nhwc and not any(len(shapes[n]) == 4 for n in names):
        raise UsageError(
            "NHWC layout was asked for, but the model has no 4-D (image) input.",
            hint='Drop layout = "NHWC" from the recipe for this model.',
        )
    module = source.module
    notes: list[str] = []
    float_nodes: tuple[str, ...] = ()
    mixed: tuple[MixedOutput, ...] = ()  # outputs a mixed-range final cat writes (kept float32)
    if precision == Precision.INT8:
        if not request.calibration:
            raise UsageError(
                "INT8 TFLite from PyTorch needs calibration data.",
                hint="Pass --calibration FILE.npz or a folder.",
            )
        from litert_torch.quantize import quant_config as litert_quant_config

        quantized = pt2e.quantize(torch, module, args, names, request, fragile=True)
        module, quant_config = quantized.graph, litert_quant_config.QuantConfig(pt2e_quantizer=quantized.quantizer)
        notes, float_nodes = pt2e.describe(quantized, request, "litert-torch quantizer")
        mixed = quantized.mixed_outputs
    else:
        quant_config = None
    layout = None
    four_d = [i for i, n in enumerate(names) if len(shapes[n]) == 4] if nhwc else []
    module = _named_inputs(torch, module, names, four_d)
    if nhwc:
        args = tuple(a.permute(0, 2, 3, 1).contiguous() if i in four_d else a for i, a in enumerate(args))
        layout = Layout.NHWC
        notes.append(f"Channel-last (NHWC) I/O for {', '.join(names[i] for i in four_d)}; the model is NCHW.")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.stem + ".partial.tflite")
    try:
        with _quiet(litert_torch):
            edge = litert_torch.convert(module, (), dict(zip(names, args)), quant_config=quant_config)
            edge.export(str(tmp))
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ConversionError(
            f"litert-torch could not convert {str(source.path)!r} ({precision}): {type(exc).__name__}: "
            f"{key_line(exc)}",
            hint="Run with --debug for the converter's traceback, or use --format onnx.",
        ) from exc
    os.replace(tmp, output)
    float_io = _float_io(output, request, mixed) if float_nodes else ()
    notes += [f"{f.role} {f.name!r} stays float32 ({f.reason}): {f.detail}" for f in float_io
              if f.reason == FloatIOReason.MIXED_RANGES]
    return BuiltArtifact(
        path=output, float_nodes=float_nodes, notes=tuple(notes), exporter=f"litert-torch {_version(litert_torch)}",
        layout=layout, float_io=float_io,
    )


def _refuse_unbuilt(request: ConversionRequest) -> TorchSource:
    """The request's PyTorch source, or a UsageError for what this route does not build (fp16, dynamic,
    TorchScript), saying why and which route does."""
    source = request.source
    if not isinstance(source, TorchSource):
        raise UsageError(f"The PyTorch TFLite route got a {source.framework} source.")
    precision = request.recipe.precision
    if precision in (Precision.DYNAMIC, Precision.FP16):
        reason = (
            "PT2E dynamic quantization produced a broken model in our measurements (accuracy 0.06 on digits)"
            if precision == Precision.DYNAMIC
            else "litert-torch has no fp16 weight path"
        )
        raise UsageError(
            f"The PyTorch -> TFLite route (litert-torch) does not build {precision} artifacts: {reason}.",
            hint=f"Use --format onnx for {precision} (it is derived from the exported ONNX model), or "
            "--precision int8 / fp32 for TFLite.",
        )
    if source.framework == Framework.TORCHSCRIPT:
        raise UsageError(
            f"TorchScript ({str(source.path)!r}) cannot go to TFLite: litert-torch traces with torch.export, which "
            "does not take ScriptModules.",
            hint="Pass the factory (file.py:make_model) or an ExportedProgram (.pt2) for --format tflite, or use "
            "--format onnx.",
        )
    return source


def _float_io(path: Path, request: ConversionRequest, mixed: Sequence[MixedOutput] = ()) -> tuple[FloatIO, ...]:
    """The inputs/outputs that layers kept in float left float32 while the others are int8: the quantizer puts
    no quantize in front of a float layer, so the I/O next to it stays float (the runner feeds it as float).
    An output a mixed-range final cat writes (``mixed``, by position) is float on purpose: ``MIXED_RANGES``."""
    from toolkit.runtimes.inspection.tflite import inspect_tflite

    info = inspect_tflite(path)
    sides = [(TensorRole.INPUT, spec) for spec in info.inputs] + [(TensorRole.OUTPUT, spec) for spec in info.outputs]
    if all(spec.quantization is None for _, spec in sides) and request.recipe.io_dtype == IoDtype.FLOAT32:
        return ()  # float I/O was asked for
    why = {info.outputs[m.index].name: m.why for m in mixed if m.index < len(info.outputs)}

    def record(role: TensorRole, spec: TensorSpec) -> FloatIO:
        if role is TensorRole.OUTPUT and spec.name in why:
            return FloatIO(name=spec.name, role=role, reason=FloatIOReason.MIXED_RANGES, detail=why[spec.name])
        side = "reads" if role is TensorRole.INPUT else "writes"
        return FloatIO(name=spec.name, role=role, reason=FloatIOReason.FLOAT_NEIGHBOUR,
                       detail=f"{spec.name} is {spec.dtype}: the layer that {side} it is kept in float, so no int8 "
                       "tensor meets it there")

    return tuple(record(role, spec) for role, spec in sides if spec.quantization is None)


def _import_litert_torch() -> ModuleType:
    try:
        import litert_torch
    except ImportError as exc:
        raise MissingDependency("litert-torch", extra="litert-torch", purpose=_PURPOSE) from exc
    return litert_torch


def _version(module: ModuleType) -> str:
    return str(getattr(module, "__version__", "?"))


def _named_inputs(
    torch: Any, module: nn.Module, names: list[str], four_d: list[int]  # Any: subclasses its nn.Module
) -> nn.Module:
    """``module`` called with its inputs by name (so the TFLite signature keeps the source's input names, and
    graph modules from ``torch.export`` that take positional inputs convert alike), with a transpose
    NHWC -> NCHW in front of the inputs at ``four_d``."""

    class NamedInputs(torch.nn.Module):  # type: ignore[misc,unused-ignore]  # torch arrives as an untyped module object
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, **feeds: Any) -> Any:
            values = [feeds[name] for name in names]
            return self.inner(*(v.permute(0, 3, 1, 2) if i in four_d else v for i, v in enumerate(values)))

    wrapper = NamedInputs()
    wrapper.training = False  # not .eval(): graph modules from torch.export refuse train()/eval()
    return wrapper


@contextlib.contextmanager
def _quiet(litert_torch: ModuleType) -> Iterator[None]:
    """litert-torch prints its progress to stdout (rich); keep stdout for ``--json``."""
    config = getattr(litert_torch, "config", None)
    previous = getattr(config, "show_progress", None)
    with contextlib.suppress(Exception):
        config.show_progress = False  # type: ignore[union-attr]
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            yield
    finally:
        if previous is not None:
            with contextlib.suppress(Exception):
                config.show_progress = previous  # type: ignore[union-attr]
