"""PyTorch -> ExecuTorch (``.pte``), XNNPACK-delegated: PyTorch's own on-device runtime.

``torch.export`` -> ``to_edge_transform_and_lower`` with the ``XnnpackPartitioner`` -> ``to_executorch()``; the
share of operator nodes the delegate took (``get_delegation_info``) is recorded in ``BuiltArtifact.pte``.
``fp32`` is the float module; ``fp16`` is a half copy of it behind float32 I/O (XNNPACK 1.5 takes float16 nodes
through its float configs; the two casts at the border run on ExecuTorch's portable kernels), so it is fed, verified
and checked on the device like the fp32 one (under qemu-user it ran as a Cortex-A76, which has FP16 arithmetic, and as
an A72, which has none, with outputs differing in the third decimal). ``int8`` is PT2E static quantization with
``XNNPACKQuantizer`` through ``pt2e.quantize`` (float I/O: the delegate quantizes at its boundary). ``dynamic`` is
refused (``routes.py``): PT2E dynamic quantization broke digits in our measurements. The bundled program is
``executorch.bundled``. Without the ``executorch`` extra the route raises MissingDependency. ``Any``: torch and ExecuTorch
objects (both are imported lazily).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolkit.conversion.pt2e import quantize as pt2e
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.errors import ConversionError, UsageError, key_line
from toolkit.model.artifact import PteRecord
from toolkit.model.vocabulary import Precision
from toolkit.runtimes.inspection.pte import HALF_METHOD, QUANTIZED_METHOD, import_executorch
from toolkit.sources.torch import TorchSource, import_torch, missing_shape_error

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor, nn
    from torch.fx import GraphModule

_PURPOSE = "Converting a PyTorch model to ExecuTorch (.pte)"


def convert(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """Build ``request.recipe`` (fp32 or int8) as a .pte file at ``output``."""
    source = request.source
    if not isinstance(source, TorchSource):
        raise UsageError(f"The PyTorch ExecuTorch route got a {source.framework} source.")
    precision = request.recipe.precision
    if precision == Precision.DYNAMIC:
        raise UsageError(f"The PyTorch -> ExecuTorch route does not build {precision} artifacts: PT2E dynamic "
                         "quantization broke a trained model in our measurements.",
                         hint=f"Use --format onnx for {precision}, or --precision int8 / fp16 / fp32 for .pte.")
    if request.dynamic_batch:
        raise UsageError("A dynamic batch is not offered for .pte artifacts; they run batch 1 here.",
                         hint="Drop the dynamic batch for --format pte, or use --format onnx.")
    import_executorch(_PURPOSE)
    torch = import_torch(_PURPOSE)
    missing = [spec.name for spec in source.inputs if spec.name not in request.input_shapes]
    if missing:
        raise missing_shape_error(source, missing)
    args, names = pt2e.inputs(torch, request)
    module = source.module
    notes: list[str] = []
    float_nodes: tuple[str, ...] = ()
    quantized_tensors = 0
    if precision == Precision.INT8:
        if not request.calibration:
            raise UsageError("INT8 .pte needs calibration data.", hint="Pass --calibration FILE.npz or a folder.")
        quantized = pt2e.quantize(torch, module, args, names, request, fragile=True)
        module = _folded(torch, quantized.graph)
        quantized_tensors = pt2e.quantized_tensors(quantized.graph)
        notes, float_nodes = pt2e.describe(quantized, request, "XNNPACK quantizer")
    half_tensors = 0
    if precision == Precision.FP16:
        module, half_tensors = _half(torch, module)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.stem + ".partial.pte")
    try:
        program, delegation = _lower(torch, module, args, {QUANTIZED_METHOD: quantized_tensors,
                                                           HALF_METHOD: half_tensors})
        tmp.write_bytes(program.buffer)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ConversionError(
            f"ExecuTorch could not lower {str(source.path)!r} ({precision}): {type(exc).__name__}: {key_line(exc)}",
            hint="Run with --debug for the traceback, or use --format onnx / tflite.",
        ) from exc
    os.replace(tmp, output)
    notes.append(f"XNNPACK took {delegation.delegated_nodes} of {delegation.total_nodes} operator nodes "
                 f"({delegation.delegated_share:.0%}); the rest runs on ExecuTorch's portable kernels.")
    return BuiltArtifact(path=output, float_nodes=float_nodes, notes=tuple(notes),
                         exporter=f"executorch {_version()} (XNNPACK)", pte=delegation)


def _folded(torch: ModuleType, graph: GraphModule) -> GraphModule:
    """A copy of the converted PT2E graph with each weight's ``quantize`` folded into an int8 constant (what
    ``convert_pt2e(fold_quantize=True)`` does): XNNPACK takes only folded weights, and an unfolded per-channel
    quantize has no ExecuTorch kernel. ``pt2e.quantize`` keeps them unfolded for its layer table and the cache."""
    import copy

    from torchao.quantization.pt2e.constant_fold import constant_fold
    from torchao.quantization.pt2e.quantize_pt2e import _quant_node_constraint

    folded = copy.deepcopy(graph)
    constant_fold(folded, _quant_node_constraint)
    return folded


def _half(torch: Any, module: nn.Module) -> tuple[nn.Module, int]:  # Any: subclasses torch.nn.Module
    """A half copy of ``module`` behind float32 I/O (float inputs cast to float16 on the way in, float16 outputs
    back to float32), and how many of its weights are float16."""
    import copy

    from toolkit.compat.torch import tree_map

    half = copy.deepcopy(module).half()
    count = sum(1 for t in (*half.parameters(), *half.buffers()) if t.dtype == torch.float16)

    def to(dtype: Any, other: Any) -> Any:
        return lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == other else t

    class FloatIO(torch.nn.Module):  # type: ignore[misc,unused-ignore]  # subclassing Any (--strict)
        def __init__(self) -> None:
            super().__init__()
            self.inner = half

        def forward(self, *args: Any) -> Any:
            return tree_map(to(torch.float32, torch.float16), self.inner(*tree_map(to(torch.float16, torch.float32),
                                                                                   args)))

    return FloatIO().eval(), count


def _lower(torch: ModuleType, module: nn.Module, args: tuple[Tensor, ...],
           constants: dict[str, int]) -> tuple[Any, PteRecord]:  # Any: ExecuTorch's program
    """``module`` exported, lowered to XNNPACK and serialized; and how many nodes the delegate took."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    from toolkit.conversion.onnx.from_torch import quiet_export

    with quiet_export(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(module, args)
        edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()],
                                           constant_methods=constants)
        info = get_delegation_info(edge.exported_program().graph_module)
        program = edge.to_executorch()
    delegated, other = int(info.num_delegated_nodes), int(info.num_non_delegated_nodes)
    return program, PteRecord(delegated_nodes=delegated, total_nodes=delegated + other,
                              executorch_version=_version())


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "?"
