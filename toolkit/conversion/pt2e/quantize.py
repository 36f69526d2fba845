"""PT2E static INT8 for the PyTorch -> TFLite and -> ExecuTorch routes, optionally with layers kept in float
(the quantizer with exclusions: ``pt2e.quantizer``; the layer table: ``pt2e.layers``).

``torch.export``, ``prepare_pt2e`` with the route's quantizer, calibration on every sample, ``convert_pt2e``
(``fold_quantize=False``: each quantized tensor is a ``quantize -> dequantize`` pair; litert-torch converts a
float island as float ops between them). A name is an FX node name (``linear_1``) or a module's qualified name
(``layer1.0.conv1``: every node inside it); ``fragile`` adds ``pt2e.fragile``'s nodes (see ``quantize``).

**Calibration cache.** One run calibrates its full quantization once (``_CACHE``). Observers see float values
only (``prepare_pt2e`` inserts observers, not fake quantizers), so the ranges of the layers left quantized do
not depend on which layers are kept float: a selective rebuild copies them (``_reuse_ranges``; weight observers
are filled from the weights themselves). ``Any``: the observer modules
(found by ``getattr`` on the graph)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.conversion.base import ConversionRequest
from toolkit.conversion.pt2e.fragile import MixedOutput
from toolkit.conversion.pt2e.quantizer import excluding_quantizer
from toolkit.errors import ConversionError, UsageError, key_line
from toolkit.model.vocabulary import Format, IoDtype
from toolkit.sources.torch import TorchSource, import_torch

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor, nn
    from torch.fx import GraphModule, Node

PURPOSE = "Quantizing a PyTorch model with PT2E"

# Ops that move or gate data without weights: a float island follows them (sensitivity.float_group).
PASSTHROUGH = frozenset({
    "relu", "relu_", "relu6", "hardtanh", "hardtanh_", "clamp", "flatten", "view", "reshape", "_unsafe_view",
    "permute", "transpose", "squeeze", "unsqueeze", "contiguous", "clone", "dropout", "max_pool2d",
    "adaptive_avg_pool2d", "avg_pool2d", "cat", "slice", "select", "pad", "constant_pad_nd", "upsample_nearest2d",
})




@dataclass(frozen=True)
class Quantized:
    """A converted PT2E graph (``quantize -> dequantize`` pairs left in place) and what was kept float."""

    graph: GraphModule
    quantizer: object  # the PT2EQuantizer that annotated it (litert-torch's QuantConfig takes it)
    kept_float: tuple[str, ...]  # FX node names whose quantization annotations were removed
    reused_ranges: bool = False  # the activation ranges came from the cached full calibration
    fragile: tuple[tuple[str, str], ...] = ()  # (node, why) kept float up front (``fragile.pt2e_fragile_nodes``)
    mixed_outputs: tuple[MixedOutput, ...] = ()  # outputs a mixed-range final cat writes: they stay float32


@dataclass
class _Entry:
    source: object  # compared by identity only
    calibration: object
    per_channel: bool
    fmt: Format  # the route (its quantizer): tflite | pte
    quantized: Quantized
    ranges: dict[str, dict[str, Tensor]]  # observed node name -> its activation observer's state (``_ranges``)
    # the fragile nodes and mixed outputs of this source (``_fragile``), None until a build looked for them
    fragile: tuple[tuple[tuple[str, str], ...], tuple[MixedOutput, ...]] | None = None


_CACHE: list[_Entry] = []  # the full (nothing float) quantization of the current run: one entry


def inputs(torch: ModuleType, request: ConversionRequest) -> tuple[tuple[Tensor, ...], list[str]]:
    """The tracing inputs (first calibration sample) and the input names, in the source's order."""
    from toolkit.conversion.onnx.from_torch import example_args

    source = request.source
    assert isinstance(source, TorchSource)
    shapes = {spec.name: tuple(int(d) for d in request.input_shapes[spec.name]) for spec in source.inputs}
    return example_args(torch, source, request, shapes), [spec.name for spec in source.inputs]


def quantize(
    torch: ModuleType, module: nn.Module, args: tuple[Tensor, ...], names: list[str], request: ConversionRequest, *,
    fragile: bool = False,
) -> Quantized:
    """Static PT2E int8 of ``module`` with ``nodes_to_exclude`` (and, with ``fragile``, the known-fragile nodes)
    kept float. Fragile nodes are looked for once per source; when found, the full quantization is calibrated
    first and the build with them float reuses its ranges, as selective rebuilds do."""
    from torchao.quantization.pt2e import quantize_pt2e

    from toolkit.conversion.onnx.from_torch import quiet_export

    recipe = request.recipe
    cached = _cached(request)
    graph = None
    found: tuple[tuple[str, str], ...] = ()
    mixed: tuple[MixedOutput, ...] = ()
    if fragile and cached is not None and cached.fragile is not None:
        found, mixed = cached.fragile
    elif fragile:
        graph = _export(torch, module, args)
        found, mixed = _fragile(torch, graph, request, names, args)
        if cached is not None:
            cached.fragile = (found, mixed)
    exclude = tuple(dict.fromkeys((*recipe.nodes_to_exclude, *(name for name, _ in found))))
    if cached is not None and not exclude:
        return cached.quantized
    if found and cached is None:  # the full calibration once: this build, the table and every rebuild reuse it
        quantize(torch, module, args, names, without_exclusions(request))
        cached = _cached(request)
        if cached is not None:
            cached.fragile = (found, mixed)
    writers = frozenset(m.writer for m in mixed)
    quantizer = excluding_quantizer(recipe.per_channel, exclude, keep_io=recipe.io_dtype != IoDtype.FLOAT32,
                                    float_outputs=writers, fmt=recipe.format)
    try:
        prepared_graph = graph if graph is not None else _export(torch, module, args)
        with quiet_export():
            prepared = quantize_pt2e.prepare_pt2e(prepared_graph, quantizer)
            reused = cached is not None and _reuse_ranges(torch, prepared, cached.ranges)
            if not reused:
                with torch.no_grad():
                    for sample in request.calibration:
                        prepared(*feed(torch, sample, names, args))
            ranges = _ranges(prepared)
            converted = quantize_pt2e.convert_pt2e(prepared, fold_quantize=False)
    except UsageError:
        raise
    except Exception as exc:
        raise _failed(exc) from exc
    result = Quantized(converted, quantizer, tuple(quantizer.kept_float), reused_ranges=reused, fragile=found,
                       mixed_outputs=mixed)
    if not exclude:
        _CACHE[:] = [_Entry(request.source, request.calibration, recipe.per_channel, recipe.format, result, ranges,
                            fragile=(found, mixed) if fragile else None)]
    return result


def without_exclusions(request: ConversionRequest) -> ConversionRequest:
    import dataclasses

    return dataclasses.replace(request, recipe=dataclasses.replace(request.recipe, nodes_to_exclude=()))


def _failed(exc: BaseException) -> ConversionError:
    return ConversionError(
        f"PT2E int8 quantization failed: {type(exc).__name__}: {key_line(exc)}",
        hint="Use --format onnx --precision int8 (static QDQ), or --precision fp32 for TFLite.",
    )


def _export(torch: ModuleType, module: nn.Module, args: tuple[Tensor, ...]) -> GraphModule:
    from toolkit.conversion.onnx.from_torch import quiet_export

    try:
        with quiet_export():
            return torch.export.export(module, args).module()
    except Exception as exc:
        raise _failed(exc) from exc


def graph_ops(request: ConversionRequest) -> list[tuple[str, str]]:
    """(FX node name, op name) of each call in the source's exported graph, in order: the names exclusions take."""
    torch = import_torch("Reading a PyTorch model's graph")
    args, _ = inputs(torch, request)
    source = request.source
    assert isinstance(source, TorchSource)
    graph = _export(torch, source.module, args)
    return [(node.name, op_name(node)) for node in graph.graph.nodes if node.op == "call_function"]


def _has_output_cat(graph: GraphModule) -> bool:
    """Whether a ``cat`` reaches a graph output through pass-through ops only: the cheap test that decides whether the
    float graph runs to measure the cat's input ranges (the rule's one switch: a test turns it off here)."""
    from toolkit.conversion.pt2e import fragile as fragile_pt2e

    return bool(fragile_pt2e.pt2e_output_cats(graph))


def _fragile(
    torch: ModuleType, graph: GraphModule, request: ConversionRequest, names: Sequence[str], args: Sequence[Tensor]
) -> tuple[tuple[tuple[str, str], ...], tuple[MixedOutput, ...]]:
    """The fragile nodes and mixed outputs of ``graph`` (a float export), measured on the calibration data."""
    from toolkit.conversion import fragile
    from toolkit.conversion.pt2e import fragile as fragile_pt2e

    if not _has_output_cat(graph):
        return (), ()
    samples = [feed(torch, sample, names, args) for sample in request.calibration[:fragile.RANGE_SAMPLES]]
    try:
        found, mixed = fragile_pt2e.pt2e_fragile_nodes(torch, graph, samples)
    except Exception as exc:
        raise _failed(exc) from exc
    return tuple(found), tuple(mixed)


def _cached(request: ConversionRequest) -> _Entry | None:
    for entry in _CACHE:
        if (entry.source is request.source and entry.calibration is request.calibration
                and entry.per_channel == request.recipe.per_channel and entry.fmt == request.recipe.format):
            return entry
    return None


def feed(
    torch: ModuleType, sample: Mapping[str, np.ndarray], names: Sequence[str], args: Sequence[Tensor]
) -> list[Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(sample[n]).reshape(a.shape)).to(a.dtype) for n, a in zip(names, args)]


def _observers(prepared: GraphModule) -> Iterable[tuple[Any, Node]]:  # Any: the observer module, by getattr
    """(observer module, the node it observes) for every activation observer call in ``prepared``."""
    for node in prepared.graph.nodes:
        if node.op != "call_module" or not node.args:
            continue
        module = getattr(prepared, str(node.target), None)
        observed = node.args[0]
        while getattr(observed, "op", None) == "call_module" and observed.args:  # an observer of an observer
            observed = observed.args[0]
        if module is None or not hasattr(module, "min_val") or getattr(observed, "op", None) == "get_attr":
            continue
        yield module, observed


def _ranges(prepared: GraphModule) -> dict[str, dict[str, Tensor]]:
    """Observed node name -> its activation observer's state (min/max and, for the histogram observer that
    litert-torch's symmetric config uses, the histogram its range search reads)."""
    return {observed.name: {k: v.clone() for k, v in module.state_dict().items()}
            for module, observed in _observers(prepared) if module.min_val.numel() > 0}


def _reuse_ranges(torch: ModuleType, prepared: GraphModule, ranges: Mapping[str, Mapping[str, Tensor]]) -> bool:
    """Load the activation observers of ``prepared`` with the full calibration's states and fill the weight
    observers from the weights; False (calibrate instead) when an observed tensor has no range there."""
    pending = []
    for module, observed in _observers(prepared):
        if observed.name not in ranges:
            return False
        pending.append((module, ranges[observed.name]))
    for node in prepared.graph.nodes:  # weight observers: one call on the constant they watch
        if node.op == "call_module" and node.args and getattr(node.args[0], "op", None) == "get_attr":
            module = getattr(prepared, str(node.target))
            with torch.no_grad():
                module(functools.reduce(getattr, str(node.args[0].target).split("."), prepared))
    for module, state in pending:
        module.load_state_dict({k: v.clone() for k, v in state.items()})
    return True



# --------------------------------------------------------------------------------------------- graph reading


def op_name(node: Node) -> str:
    target = node.target
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def is_op(node: Node, kinds: tuple[str, ...]) -> bool:
    return node.op == "call_function" and op_name(node) in kinds


Q_OPS = ("quantize_per_tensor", "quantize_per_channel")
DQ_OPS = ("dequantize_per_tensor", "dequantize_per_channel")




def describe(quantized: Quantized, request: ConversionRequest, quantizer: str) -> tuple[list[str], tuple[str, ...]]:
    """The notes an int8 build of either route reports (how it was calibrated, what was kept float up front and
    by request) and its float nodes (requested exclusions, then the fragile ones)."""
    from toolkit.conversion import fragile

    ranges = "activation ranges of the full calibration reused" if quantized.reused_ranges else (
        f"{len(request.calibration)} calibration samples")
    notes = [f"PT2E static int8, {quantizer} "
             f"({'per-channel' if request.recipe.per_channel else 'per-tensor'} weights, {ranges})."]
    found = quantized.fragile
    float_nodes = tuple(dict.fromkeys([*request.recipe.nodes_to_exclude, *(name for name, _ in found)]))
    if found:
        notes.append(fragile.upfront_note(found))
    if request.recipe.nodes_to_exclude:
        upfront = {name for name, _ in found}
        notes.append(f"kept in float: {', '.join(n for n in quantized.kept_float if n not in upfront)}")
    return notes, float_nodes


def quantized_tensors(graph: GraphModule) -> int:
    """How many tensors a converted PT2E graph quantizes (its ``quantize`` nodes: weights and activations)."""
    return sum(1 for node in graph.graph.nodes if is_op(node, Q_OPS))
