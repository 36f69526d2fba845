"""The layer-wise error table of a PT2E INT8 build (``layer_rows``, ranked by ``layers.pt2e_table``): TFLite's
``QuantizationDebugger`` in torch. Each quantized activation's *region* (``conv2d`` + ``relu``, or one
``max_pool2d``) is run again with *float* weights on the same dequantized inputs and compared with the tensor
after its ``quantize -> dequantize`` pair: the layer's own error, not what it inherited. Rows carry their
``float_group`` (``sensitivity.float_group``); the table reuses the run's full calibration (``pt2e._CACHE``).
``Any``: the torch module where a class derives from its ``fx.Interpreter`` (the checker cannot follow it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from toolkit.conversion.base import ConversionRequest
from toolkit.conversion.pt2e.quantize import (
    DQ_OPS, PASSTHROUGH, PURPOSE, Q_OPS, feed, inputs, is_op, op_name, quantize, without_exclusions,
)
from toolkit.conversion.sensitivity import Row
from toolkit.errors import ConversionError
from toolkit.sources.torch import TorchSource, import_torch

if TYPE_CHECKING:  # pragma: no cover
    from torch.fx import Graph, GraphModule, Node

    from toolkit.conversion.sensitivity import ChannelError

# The table runs DEBUG_SAMPLES calibration samples when a sample's quantized activations hold at most
# TABLE_ELEMENTS values, proportionally fewer above (a ResNet50 at 224x224: the minimum).
TABLE_ELEMENTS = 2_000_000
MIN_TABLE_SAMPLES = 4


def _weight_dq(node: Node) -> Node | None:
    """The float constant behind ``node`` when it is ``dequantize(quantize(constant))`` (a weight)."""
    if not is_op(node, DQ_OPS) or not node.args:
        return None
    q: Any = node.args[0]  # Any: an FX argument, a node when its ``op`` says so (checked below)
    if getattr(q, "op", None) == "call_function" and is_op(q, Q_OPS) and getattr(q.args[0], "op", None) == "get_attr":
        return q.args[0]
    return None


@dataclass(frozen=True)
class _Layer:
    name: str  # the region's weighted node, else its output node: usable in nodes_to_exclude
    op_type: str
    output: Node  # the node whose value is quantized
    dequantized: Node  # the dq node after its quantize
    region: tuple[Node, ...]  # nodes recomputed in float, graph order


def _layers(graph: Graph) -> list[_Layer]:
    """Every quantized activation of a converted graph with the nodes that compute it (graph order)."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    layers: list[_Layer] = []
    seen: set[Node] = set()
    for q in graph.nodes:
        if not is_op(q, Q_OPS) or not q.args:
            continue
        out = q.args[0]
        if getattr(out, "op", None) != "call_function" or out in seen or is_op(out, DQ_OPS):
            continue  # inputs (placeholders), weights, and a tensor already listed
        dq = next((u for u in q.users if is_op(u, DQ_OPS)), None)
        if dq is None:
            continue
        seen.add(out)
        region: list[Node] = []
        frontier = [out]
        while frontier:
            node = frontier.pop()
            if node in region or node.op != "call_function" or is_op(node, DQ_OPS) or is_op(node, Q_OPS):
                continue
            region.append(node)
            frontier.extend(node.all_input_nodes)
        region.sort(key=order.__getitem__)
        weighted = [n for n in region if any(_weight_dq(a) is not None for a in n.all_input_nodes)]
        name = (weighted[0] if weighted else out).name
        layers.append(_Layer(name, "+".join(op_name(n) for n in region), out, dq, tuple(region)))
    return layers


def _consumers(layers: Sequence[_Layer]) -> dict[str, list[str]]:
    """Layer name -> the layers that read its (dequantized) output."""
    owner = {node: layer.name for layer in layers for node in layer.region}
    result: dict[str, list[str]] = {}
    for layer in layers:
        readers: list[str] = []
        for q in layer.output.users:
            for dq in (q.users if is_op(q, Q_OPS) else ()):
                for user in dq.users:
                    name = owner.get(user)
                    if name and name != layer.name and name not in readers:
                        readers.append(name)
        result[layer.name] = readers
    return result


def _interpreter(torch: Any, graph: GraphModule) -> Any:  # Any: subclasses torch.fx.Interpreter
    """A torch.fx.Interpreter that keeps every node's value of the last run (``values``) and computes the
    nodes that do not depend on an input (the weights' quantize -> dequantize) once for all samples."""
    import torch.fx

    constant: set[Node] = set()
    for node in graph.graph.nodes:
        if node.op == "get_attr" or (node.op == "call_function" and node.all_input_nodes
                                     and all(a in constant for a in node.all_input_nodes)):
            constant.add(node)
    cache: dict[Node, object] = {}

    class Keep(torch.fx.Interpreter):  # type: ignore[misc,unused-ignore]  # torch arrives as an untyped module object
        def run_node(self, n: Node) -> object:
            if n in cache:
                value = cache[n]
            else:
                value = super().run_node(n)
                if n in constant:
                    cache[n] = value
            self.values[n] = value
            return value

    interpreter = Keep(graph, garbage_collect_values=False)
    interpreter.values = {}
    return interpreter


def _shadow(torch: ModuleType, layer: _Layer, values: Mapping[Node, object]) -> object:
    """``layer``'s output recomputed with float weights on the same dequantized inputs."""
    import torch.fx

    local: dict[Node, object] = {}

    def value(arg: Node) -> object:
        if arg in local:
            return local[arg]
        weight = _weight_dq(arg)
        return values[weight] if weight is not None else values[arg]

    with torch.no_grad():
        for node in layer.region:
            args = torch.fx.node.map_arg(node.args, value)
            kwargs = torch.fx.node.map_arg(node.kwargs, value)
            local[node] = cast("Callable[..., object]", node.target)(*args, **kwargs)  # call_function nodes
    return local[layer.output]


TABLE_METHOD = "PT2E: each quantized layer re-run with float weights on its dequantized inputs vs its int8 output"


def layer_rows(request: ConversionRequest) -> tuple[list[Row], int]:
    """The rows of the PT2E table of ``request``'s recipe quantized in full, and the samples measured: up to
    ``DEBUG_SAMPLES`` (fewer for big models: ``TABLE_ELEMENTS``); ``layers.table_for`` ranks them."""
    from toolkit.conversion.sensitivity import DEBUG_SAMPLES, ChannelError, float_group

    if not request.calibration:
        raise ConversionError("the layer-wise table needs calibration data")
    torch = import_torch(PURPOSE)
    source = request.source
    assert isinstance(source, TorchSource)
    plain = request if not request.recipe.nodes_to_exclude else without_exclusions(request)
    args, names = inputs(torch, plain)
    graph = quantize(torch, source.module, args, names, plain).graph
    layers = _layers(graph.graph)
    stats = {layer.name: ChannelError(axis=1) for layer in layers}
    errors: dict[str, list[float]] = {layer.name: [0.0, 0.0, math.inf, -math.inf] for layer in layers}
    interpreter = _interpreter(torch, graph)
    count = DEBUG_SAMPLES
    done = 0
    with torch.no_grad():
        for sample in request.calibration:
            if done >= count:
                break
            interpreter.run(*feed(torch, sample, names, args))
            values = interpreter.values
            if done == 0:  # big models: fewer samples (the ranking needs few; the cost grows with each)
                elements = sum(int(values[layer.dequantized].numel()) for layer in layers)
                count = max(MIN_TABLE_SAMPLES, min(DEBUG_SAMPLES, DEBUG_SAMPLES * TABLE_ELEMENTS // max(elements, 1)))
            for layer in layers:
                _accumulate(torch, stats[layer.name], errors[layer.name], _shadow(torch, layer, values),
                            values[layer.dequantized])
            done += 1
    consumers = _consumers(layers)
    kinds = {layer.name: layer.op_type for layer in layers}

    def passthrough(name: str) -> bool:
        return all(part in PASSTHROUGH for part in kinds.get(name, "?").split("+"))

    rows: list[Row] = []
    for layer in layers:
        total, seen, low, high = errors[layer.name]
        rmse = math.sqrt(total / seen) if seen else math.nan
        span = high - low
        rows.append((layer.name, layer.op_type, stats[layer.name].score(),
                     (rmse / span if span > 0 else 0.0) if seen else math.nan, None,
                     float_group(layer.name, consumers, passthrough)))
    return rows, done


def _accumulate(
    torch: ModuleType, stats: ChannelError, acc: list[float], reference: object, actual: object
) -> None:
    """Add one sample of a layer to its ChannelError (per-channel sums along axis 1, in float64) and to its
    [squared error, elements, min, max] accumulator; computed in torch (threads, no copies)."""
    if not isinstance(reference, torch.Tensor) or not isinstance(actual, torch.Tensor) or (
            reference.shape != actual.shape or reference.ndim == 0):
        stats.bad_shape = True
        return
    ref, act = reference.float(), actual.float()
    if ref.ndim < 2:
        ref, act = ref.reshape(1, -1), act.reshape(1, -1)
    others = [d for d in range(ref.ndim) if d != 1]
    diff = act - ref
    signal = (ref * ref).sum(dim=others, dtype=torch.float64).numpy()
    noise = (diff * diff).sum(dim=others, dtype=torch.float64).numpy()
    if stats.signal is None:
        stats.signal, stats.noise = signal, noise
    else:
        stats.signal, stats.noise = stats.signal + signal, stats.noise + noise
    stats.samples += 1
    acc[0] += float(noise.sum())
    acc[1] += ref.numel()
    acc[2] = min(acc[2], float(ref.min()))
    acc[3] = max(acc[3], float(ref.max()))
