"""PT2E static INT8 for the PyTorch -> TFLite and -> ExecuTorch routes: quantize (optionally with layers kept in float), and the
layer-wise error table of the full quantization.

**Quantization.** ``torch.export`` of the module, ``prepare_pt2e`` with litert-torch's ``PT2EQuantizer``
(symmetric, per-channel weights as the recipe says), calibration on every calibration sample, ``convert_pt2e``
(``fold_quantize=False``: every quantized tensor is a ``quantize -> dequantize`` pair in the graph). Layers
kept in float (``recipe.nodes_to_exclude``) are taken out *after* the quantizer annotated the graph: the
annotations of each named node, and of the nodes fused with it in one pattern (``conv2d`` with its ``relu``),
are removed, so no observer lands on that layer's weights, inputs or output. litert-torch then converts the
float island as float ops between ``DEQUANTIZE`` and ``QUANTIZE``. A name is an FX node name as the table
shows it (``linear_1``) or a module's qualified name (``fc2``, ``layer1.0.conv1``: every node inside it).
With ``fragile`` (the route's int8 builds) the known-fragile nodes of ``fragile.pt2e_fragile_nodes`` join
them, found on the float graph the build exports anyway (the float range run only when a ``cat`` reaches an
output: ``_has_output_cat``), and the output a mixed-range cat writes gets no int8 quantization.

**Quantizer per route** (``_BACKENDS``, by the recipe's format): litert-torch's ``PT2EQuantizer`` for TFLite,
ExecuTorch's ``XNNPACKQuantizer`` for ``.pte``. Both annotate the same way (patterns, then shared-range ops
propagated), so exclusion, the fragile rule, the range cache and the layer table are the same code.

**Layer table** (``layer_rows``, ranked by ``layers.pt2e_table``): what TFLite's ``QuantizationDebugger`` does, in torch. The converted graph
runs on a few calibration samples; for every quantized activation (a ``quantize`` whose input is not a
weight) the nodes that produce it from the previous dequantized tensors (its *region*: ``conv2d`` + ``relu``,
or one ``max_pool2d``) are run again with the *float* weights on the same dequantized inputs, and the result
is compared with the tensor after its ``quantize -> dequantize`` pair. So each row is that layer's own error
(weight rounding and output rounding), not what it inherited from the layers before it. A row's
``float_group`` is the layer and the layers that read its output (through pass-through ops such as ``relu``
and ``flatten``): a consumer left quantized would re-quantize the tensor with the same range.

**Calibration cache.** The full quantization of one run is calibrated once: the calibrated, converted graph is
kept (one entry, per source object, calibration tuple and per-channel choice), so the table reuses the pass
the plain INT8 artifact already paid for. Observers see float values only (``prepare_pt2e`` inserts observers,
not fake quantizers), so the ranges of the layers left quantized do not depend on which layers are kept float:
a selective rebuild copies the activation ranges of the full pass instead of calibrating again
(``_reuse_ranges``; weight observers are filled from the weights themselves).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from toolkit.conversion.base import ConversionRequest
from toolkit.conversion.fragile_pt2e import MixedOutput
from toolkit.conversion.sensitivity import Row
from toolkit.errors import ConversionError, UsageError, key_line
from toolkit.sources.torch import TorchSource, import_torch

_PURPOSE = "Quantizing a PyTorch model with PT2E"

# Ops that move or gate data without weights: a float island is followed through them to the compute layers
# behind (sensitivity.float_group), which would otherwise re-quantize the tensor.
PASSTHROUGH = frozenset({
    "relu", "relu_", "relu6", "hardtanh", "hardtanh_", "clamp", "flatten", "view", "reshape", "_unsafe_view",
    "permute", "transpose", "squeeze", "unsqueeze", "contiguous", "clone", "dropout", "max_pool2d",
    "adaptive_avg_pool2d", "avg_pool2d", "cat", "slice", "select", "pad", "constant_pad_nd", "upsample_nearest2d",
})


# The table runs DEBUG_SAMPLES calibration samples when a sample's quantized activations hold at most
# TABLE_ELEMENTS values, proportionally fewer above (a ResNet50 at 224x224: the minimum).
TABLE_ELEMENTS = 2_000_000
MIN_TABLE_SAMPLES = 4


@dataclass(frozen=True)
class Quantized:
    """A converted PT2E graph (``quantize -> dequantize`` pairs left in place) and what was kept float."""

    graph: Any  # torch.fx.GraphModule
    quantizer: Any  # the PT2EQuantizer that annotated it (litert-torch's QuantConfig takes it)
    kept_float: tuple[str, ...]  # FX node names whose quantization annotations were removed
    reused_ranges: bool = False  # the activation ranges came from the cached full calibration
    fragile: tuple[tuple[str, str], ...] = ()  # (node, why) kept float up front (``fragile.pt2e_fragile_nodes``)
    mixed_outputs: tuple[MixedOutput, ...] = ()  # outputs a mixed-range final cat writes: they stay float32


@dataclass
class _Entry:
    source: Any
    calibration: Any
    per_channel: bool
    fmt: str  # the route (its quantizer): "tflite" | "pte"
    quantized: Quantized
    ranges: dict[str, dict[str, Any]]  # observed node name -> its activation observer's state (``_ranges``)
    # the fragile nodes and mixed outputs of this source (``_fragile``), None until a build looked for them
    fragile: tuple[tuple[tuple[str, str], ...], tuple[MixedOutput, ...]] | None = None


_CACHE: list[_Entry] = []  # the full (nothing float) quantization of the current run: one entry


def inputs(torch: Any, request: ConversionRequest) -> tuple[tuple[Any, ...], list[str]]:
    """The tracing inputs (first calibration sample) and the input names, in the source's order."""
    from toolkit.conversion.torch_onnx import example_args

    source = request.source
    assert isinstance(source, TorchSource)
    shapes = {spec.name: tuple(int(d) for d in request.input_shapes[spec.name]) for spec in source.inputs}
    return example_args(torch, source, request, shapes), [spec.name for spec in source.inputs]


def quantize(
    torch: Any, module: Any, args: tuple[Any, ...], names: list[str], request: ConversionRequest, *,
    fragile: bool = False,
) -> Quantized:
    """Static PT2E int8 of ``module`` with ``request.recipe.nodes_to_exclude`` kept in float. With ``fragile``
    the known-fragile nodes (``fragile.pt2e_fragile_nodes``: a mixed-range final cat and the detection head
    behind it) are kept float too, and the outputs such a cat writes stay float32 even with int8 I/O. They are
    looked for once per source (the structural test on the graph this build exports anyway; the float range
    run only when a candidate cat exists); when found, the full quantization is calibrated first and the
    build with them float reuses its ranges, as selective rebuilds do."""
    from torchao.quantization.pt2e import quantize_pt2e

    from toolkit.conversion.torch_onnx import quiet_export

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
        quantize(torch, module, args, names, _without_exclusions(request))
        cached = _cached(request)
        if cached is not None:
            cached.fragile = (found, mixed)
    writers = frozenset(m.writer for m in mixed)
    quantizer = _quantizer(recipe.per_channel, exclude, keep_io=recipe.io_dtype != "float32", float_outputs=writers,
                           fmt=str(recipe.format))
    try:
        prepared_graph = graph if graph is not None else _export(torch, module, args)
        with quiet_export():
            prepared = quantize_pt2e.prepare_pt2e(prepared_graph, quantizer)
            reused = cached is not None and _reuse_ranges(torch, prepared, cached.ranges)
            if not reused:
                with torch.no_grad():
                    for sample in request.calibration:
                        prepared(*_feed(torch, sample, names, args))
            ranges = _ranges(prepared)
            converted = quantize_pt2e.convert_pt2e(prepared, fold_quantize=False)
    except UsageError:
        raise
    except Exception as exc:
        raise _failed(exc) from exc
    result = Quantized(converted, quantizer, tuple(quantizer.kept_float), reused_ranges=reused, fragile=found,
                       mixed_outputs=mixed)
    if not exclude:
        _CACHE[:] = [_Entry(request.source, request.calibration, recipe.per_channel, str(recipe.format), result, ranges,
                            fragile=(found, mixed) if fragile else None)]
    return result


def _failed(exc: BaseException) -> ConversionError:
    return ConversionError(
        f"PT2E int8 quantization failed: {type(exc).__name__}: {key_line(exc)}",
        hint="Use --format onnx --precision int8 (static QDQ), or --precision fp32 for TFLite.",
    )


def _export(torch: Any, module: Any, args: tuple[Any, ...]) -> Any:
    """The float FX graph PT2E annotates: ``torch.export.export(module, args).module()``."""
    from toolkit.conversion.torch_onnx import quiet_export

    try:
        with quiet_export():
            return torch.export.export(module, args).module()
    except Exception as exc:
        raise _failed(exc) from exc


def _has_output_cat(graph: Any) -> bool:
    """Whether a ``cat`` reaches a graph output through pass-through ops only (the fragile rule's candidates):
    the cheap structural test that decides whether the float graph runs to measure the cat's input ranges.
    The rule's one switch (a test turns it off here)."""
    from toolkit.conversion import fragile_pt2e

    return bool(fragile_pt2e.pt2e_output_cats(graph))


def _fragile(
    torch: Any, graph: Any, request: ConversionRequest, names: Sequence[str], args: Sequence[Any]
) -> tuple[tuple[tuple[str, str], ...], tuple[MixedOutput, ...]]:
    """The fragile nodes and mixed outputs of ``graph`` (a float export), measured on the calibration data."""
    from toolkit.conversion import fragile, fragile_pt2e

    if not _has_output_cat(graph):
        return (), ()
    samples = [_feed(torch, sample, names, args) for sample in request.calibration[:fragile.RANGE_SAMPLES]]
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


def _feed(torch: Any, sample: Mapping[str, np.ndarray], names: Sequence[str], args: Sequence[Any]) -> list[Any]:
    return [torch.from_numpy(np.ascontiguousarray(sample[n]).reshape(a.shape)).to(a.dtype) for n, a in zip(names, args)]


def _observers(prepared: Any) -> Iterable[tuple[Any, Any]]:
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


def _ranges(prepared: Any) -> dict[str, dict[str, Any]]:
    """Observed node name -> its activation observer's state (min/max and, for the histogram observer that
    litert-torch's symmetric config uses, the histogram its range search reads)."""
    return {observed.name: {k: v.clone() for k, v in module.state_dict().items()}
            for module, observed in _observers(prepared) if module.min_val.numel() > 0}


def _reuse_ranges(torch: Any, prepared: Any, ranges: Mapping[str, Mapping[str, Any]]) -> bool:
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
                module(_attr(prepared, str(node.args[0].target)))
    for module, state in pending:
        module.load_state_dict({k: v.clone() for k, v in state.items()})
    return True


def _attr(graph: Any, target: str) -> Any:
    value = graph
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _backend(fmt: str) -> tuple[Any, Any, Any]:
    """(quantizer class, its symmetric config getter, its propagate_annotation) for the route ``fmt``."""
    if fmt == "pte":
        from executorch.backends.xnnpack.quantizer import xnnpack_quantizer as xnn
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import propagate_annotation as propagate

        return xnn.XNNPACKQuantizer, xnn.get_symmetric_quantization_config, propagate
    from litert_torch.quantize import pt2e_quantizer
    from litert_torch.quantize.pt2e_quantizer_utils import propagate_annotation

    return pt2e_quantizer.PT2EQuantizer, pt2e_quantizer.get_symmetric_quantization_config, propagate_annotation


def _quantizer(per_channel: bool, exclude: Sequence[str], *, keep_io: bool,
               float_outputs: frozenset[str] = frozenset(), fmt: str = "tflite") -> Any:
    """The route's PT2E quantizer (``_backend``) whose annotations skip the layers named in ``exclude``; with
    ``keep_io`` an excluded layer next to a model input or output keeps that input's or output's quantization,
    so the float island stays inside the graph and the artifact's I/O stays int8, except the outputs written by
    the nodes in ``float_outputs`` (a mixed-range cat: one int8 scale there would flatten the scores again)."""
    base, config, propagate_annotation = _backend(fmt)

    class Excluding(base):  # type: ignore[misc,valid-type]
        """Annotates as the base class, then drops the annotations of the excluded layers."""

        def __init__(self) -> None:
            super().__init__()
            self.kept_float: list[str] = []

        def annotate(self, model: Any) -> Any:
            first = getattr(self, "_annotate_for_static_quantization_config", None) or getattr(
                self, "_annotate_for_quantization_config")
            model = first(model)
            if exclude:
                dropped = _drop_annotations(model, exclude, keep_io=keep_io, float_outputs=float_outputs)
                propagate_annotation(model)
                dropped += _drop_annotations(model, exclude, fused=False, keep_io=keep_io,  # shared-range ops
                                             float_outputs=float_outputs)  # annotated just now
                self.kept_float = list(dict.fromkeys(dropped))
            else:
                propagate_annotation(model)
            return model

    quantizer = Excluding()
    quantizer.set_global(config(is_per_channel=per_channel, is_dynamic=False))
    return quantizer


def _module_path(node: Any) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def _selected(node: Any, names: set[str]) -> bool:
    if node.name in names:
        return True
    path = _module_path(node)
    return bool(path) and any(path == n or path.startswith(n + ".") for n in names)


def _drop_annotations(model: Any, exclude: Sequence[str], *, fused: bool = True, keep_io: bool = False,
                      float_outputs: frozenset[str] = frozenset()) -> list[str]:
    """Remove the quantization annotations of the nodes ``exclude`` names (and, with ``fused``, of the nodes
    annotated in one pattern with them); returns the compute nodes made float. Unknown names are a
    UsageError. With ``keep_io`` the quantization of a model input read, or of a model output written, by
    such a node stays (only that one edge: the node itself computes in float), except an output written by a
    node in ``float_outputs``."""
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation

    names = set(exclude)
    nodes = [n for n in model.graph.nodes if n.op == "call_function"]
    if fused:
        known = {n.name for n in nodes} | {p for n in nodes for p in _prefixes(_module_path(n))}
        unknown = sorted(names - known)
        if unknown:
            sample = ", ".join(n.name for n in nodes[:8])
            raise UsageError(
                f"nodes_to_exclude names nodes this PyTorch model does not have: {', '.join(unknown)}.",
                hint=f"Use node names from `edgetk inspect BUNDLE --layers` (e.g. {sample}) or module names.",
            )
    chosen = [n for n in nodes if _selected(n, names)]
    if fused:
        chosen = _fused_with(chosen)
    dropped = []
    for node in chosen:
        annotation = node.meta.pop("quantization_annotation", None)
        if annotation is None:
            continue
        if node.op == "call_function":
            dropped.append(node.name)
        if not keep_io:
            continue
        inputs = {a: spec for a, spec in annotation.input_qspec_map.items() if a.op == "placeholder"}
        writes_output = any(u.op == "output" for u in node.users) and node.name not in float_outputs
        output = annotation.output_qspec if writes_output else None
        if inputs or output is not None:
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map=inputs, output_qspec=output, _annotated=True)
    return dropped


def _prefixes(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _fused_with(nodes: Sequence[Any]) -> list[Any]:
    """``nodes`` and the annotated nodes in one pattern with them: an annotated node whose output is not
    quantized (no ``output_qspec``) belongs with its annotated users (``conv2d`` -> ``relu``)."""

    def annotation(node: Any) -> Any:
        return node.meta.get("quantization_annotation")

    def fused(a: Any, b: Any) -> bool:  # a feeds b inside one pattern
        ann_a, ann_b = annotation(a), annotation(b)
        return ann_a is not None and ann_b is not None and ann_a.output_qspec is None

    group = list(nodes)
    frontier = list(nodes)
    while frontier:
        node = frontier.pop()
        neighbours = [u for u in node.users if fused(node, u)]
        neighbours += [a for a in node.all_input_nodes if fused(a, node)]
        for other in neighbours:
            if other not in group:
                group.append(other)
                frontier.append(other)
    return group


# --------------------------------------------------------------------------------------------- layer table


def _op_name(node: Any) -> str:
    target = node.target
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def _is(node: Any, kinds: tuple[str, ...]) -> bool:
    return node.op == "call_function" and _op_name(node) in kinds


_Q = ("quantize_per_tensor", "quantize_per_channel")
_DQ = ("dequantize_per_tensor", "dequantize_per_channel")


def _weight_dq(node: Any) -> Any | None:
    """The float constant behind ``node`` when it is ``dequantize(quantize(constant))`` (a weight)."""
    if not _is(node, _DQ) or not node.args:
        return None
    q = node.args[0]
    if getattr(q, "op", None) == "call_function" and _is(q, _Q) and getattr(q.args[0], "op", None) == "get_attr":
        return q.args[0]
    return None


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


def quantized_tensors(graph: Any) -> int:
    """How many tensors a converted PT2E graph quantizes (its ``quantize`` nodes: weights and activations)."""
    return sum(1 for node in graph.graph.nodes if _is(node, _Q))


@dataclass(frozen=True)
class _Layer:
    name: str  # the region's weighted node, else its output node: usable in nodes_to_exclude
    op_type: str
    output: Any  # the node whose value is quantized
    dequantized: Any  # the dq node after its quantize
    region: tuple[Any, ...]  # nodes recomputed in float, graph order


def _layers(graph: Any) -> list[_Layer]:
    """Every quantized activation of a converted graph with the nodes that compute it (graph order)."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    layers: list[_Layer] = []
    seen: set[Any] = set()
    for q in graph.nodes:
        if not _is(q, _Q) or not q.args:
            continue
        out = q.args[0]
        if getattr(out, "op", None) != "call_function" or out in seen or _is(out, _DQ):
            continue  # inputs (placeholders), weights, and a tensor already listed
        dq = next((u for u in q.users if _is(u, _DQ)), None)
        if dq is None:
            continue
        seen.add(out)
        region: list[Any] = []
        frontier = [out]
        while frontier:
            node = frontier.pop()
            if node in region or node.op != "call_function" or _is(node, _DQ) or _is(node, _Q):
                continue
            region.append(node)
            frontier.extend(node.all_input_nodes)
        region.sort(key=order.__getitem__)
        weighted = [n for n in region if any(_weight_dq(a) is not None for a in n.all_input_nodes)]
        name = (weighted[0] if weighted else out).name
        layers.append(_Layer(name, "+".join(_op_name(n) for n in region), out, dq, tuple(region)))
    return layers


def _consumers(layers: Sequence[_Layer]) -> dict[str, list[str]]:
    """Layer name -> the layers that read its (dequantized) output."""
    owner = {node: layer.name for layer in layers for node in layer.region}
    result: dict[str, list[str]] = {}
    for layer in layers:
        readers: list[str] = []
        for q in layer.output.users:
            for dq in (q.users if _is(q, _Q) else ()):
                for user in dq.users:
                    name = owner.get(user)
                    if name and name != layer.name and name not in readers:
                        readers.append(name)
        result[layer.name] = readers
    return result


def _interpreter(torch: Any, graph: Any) -> Any:
    """A torch.fx.Interpreter that keeps every node's value of the last run (``values``) and computes the
    nodes that do not depend on an input (the weights' quantize -> dequantize) once for all samples."""
    import torch.fx

    constant: set[Any] = set()
    for node in graph.graph.nodes:
        if node.op == "get_attr" or (node.op == "call_function" and node.all_input_nodes
                                     and all(a in constant for a in node.all_input_nodes)):
            constant.add(node)
    cache: dict[Any, Any] = {}

    class Keep(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
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


def _shadow(torch: Any, layer: _Layer, values: Mapping[Any, Any]) -> Any:
    """``layer``'s output recomputed with float weights on the same dequantized inputs."""
    import torch.fx

    local: dict[Any, Any] = {}

    def value(arg: Any) -> Any:
        if arg in local:
            return local[arg]
        weight = _weight_dq(arg)
        return values[weight] if weight is not None else values[arg]

    with torch.no_grad():
        for node in layer.region:
            args = torch.fx.node.map_arg(node.args, value)
            kwargs = torch.fx.node.map_arg(node.kwargs, value)
            local[node] = node.target(*args, **kwargs)
    return local[layer.output]


TABLE_METHOD = "PT2E: each quantized layer re-run with float weights on its dequantized inputs vs its int8 output"


def layer_rows(request: ConversionRequest) -> tuple[list[Row], int]:
    """The rows of the layer-wise error table of ``request``'s recipe quantized in full (PT2E, the TFLite route)
    and the samples measured: up to ``DEBUG_SAMPLES`` calibration samples (fewer for big models:
    ``TABLE_ELEMENTS``). ``layers.table_for`` ranks them into the bundle's table."""
    from toolkit.conversion.sensitivity import DEBUG_SAMPLES, ChannelError, float_group

    if not request.calibration:
        raise ConversionError("the layer-wise table needs calibration data")
    torch = import_torch(_PURPOSE)
    source = request.source
    assert isinstance(source, TorchSource)
    plain = request if not request.recipe.nodes_to_exclude else _without_exclusions(request)
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
            interpreter.run(*_feed(torch, sample, names, args))
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


def _without_exclusions(request: ConversionRequest) -> ConversionRequest:
    import dataclasses

    return dataclasses.replace(request, recipe=dataclasses.replace(request.recipe, nodes_to_exclude=()))


def _accumulate(torch: Any, stats: Any, acc: list[float], reference: Any, actual: Any) -> None:
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
