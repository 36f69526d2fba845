"""The PT2E quantizer of each route (litert-torch's ``PT2EQuantizer`` for TFLite, ExecuTorch's
``XNNPACKQuantizer`` for ``.pte``; both annotate the same way: patterns, then shared-range ops propagated) with
layers kept in float (``recipe.nodes_to_exclude``): the annotations of each named node, and of the nodes fused
with it in one pattern (``conv2d`` with its ``relu``), are removed after the quantizer annotated the graph, so
no observer lands on that layer's weights, inputs or output. ``Any``: the backends' quantizer classes (untyped).

One module called twice (a shared ``nn.MaxPool2d``) is annotated call by call (``_one_partition_per_call``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from toolkit.errors import UsageError
from toolkit.model.vocabulary import Format

if TYPE_CHECKING:  # pragma: no cover
    from torch.fx import GraphModule, Node


def _backend(fmt: Format) -> tuple[Any, Any, Any]:  # Any: executorch's and litert-torch's untyped classes
    """(quantizer class, its symmetric config getter, its propagate_annotation) for the route ``fmt``."""
    if fmt == Format.PTE:
        from executorch.backends.xnnpack.quantizer import xnnpack_quantizer as xnn
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import propagate_annotation as propagate

        return xnn.XNNPACKQuantizer, xnn.get_symmetric_quantization_config, propagate
    from litert_torch.quantize import pt2e_quantizer
    from litert_torch.quantize.pt2e_quantizer_utils import propagate_annotation

    return pt2e_quantizer.PT2EQuantizer, pt2e_quantizer.get_symmetric_quantization_config, propagate_annotation


def excluding_quantizer(per_channel: bool, exclude: Sequence[str], *, keep_io: bool,
                        float_outputs: frozenset[str] = frozenset(), fmt: Format = Format.TFLITE) -> Any:  # Any: as _backend
    """The route's PT2E quantizer (``_backend``) whose annotations skip the layers named in ``exclude``; ``keep_io``
    and ``float_outputs`` as in ``_drop_annotations`` (a mixed-range cat's output: one int8 scale would flatten
    the scores again)."""
    base, config, propagate_annotation = _backend(fmt)

    class Excluding(base):  # type: ignore[misc,valid-type]
        """Annotates as the base class, then drops the annotations of the excluded layers."""

        def __init__(self) -> None:
            super().__init__()
            self.kept_float: list[str] = []

        def annotate(self, model: GraphModule) -> GraphModule:
            first = getattr(self, "_annotate_for_static_quantization_config", None) or getattr(
                self, "_annotate_for_quantization_config")
            with _one_partition_per_call(model):
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


@contextlib.contextmanager
def _one_partition_per_call(model: GraphModule) -> Iterator[None]:
    """While the base quantizer annotates: each node's innermost ``nn_module_stack`` entry names its call (the
    entry's key, ``L__self__pool@1``), not its module (``pool``). The annotators find a module's nodes with
    torch's ``get_source_partitions``, which on a non-strict export (no ``source_fn_stack``) groups them by that
    module name: one module called twice is one partition of two calls. litert-torch's max_pool2d annotator then
    takes the pool of one call and the output node of an arbitrary one (the first of a set of nodes, hashed by
    address), and the first pool's output may share the range of the second pool's input, which the graph
    computes later: ``prepare_pt2e`` fails ("'relu_1' not in ...") in some processes and not in others. The
    entries are put back afterwards (exclusions name modules)."""
    saved = []
    for node in model.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            key, (_path, kind) = list(stack.items())[-1]
            saved.append((node, stack))
            node.meta["nn_module_stack"] = {**stack, key: (key, kind)}
    try:
        yield
    finally:
        for node, stack in saved:
            node.meta["nn_module_stack"] = stack


def _module_path(node: Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def _selected(node: Node, names: set[str]) -> bool:
    if node.name in names:
        return True
    path = _module_path(node)
    return bool(path) and any(path == n or path.startswith(n + ".") for n in names)


def _drop_annotations(model: GraphModule, exclude: Sequence[str], *, fused: bool = True, keep_io: bool = False,
                      float_outputs: frozenset[str] = frozenset()) -> list[str]:
    """Remove the quantization annotations of the nodes ``exclude`` names (with ``fused``, also of the nodes annotated
    in one pattern with them); returns the compute nodes made float; unknown names are a UsageError. With
    ``keep_io`` a model input read or output written by such a node stays quantized (that edge only), except an
    output written by a node in ``float_outputs``."""
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


def _fused_with(nodes: Sequence[Node]) -> list[Node]:
    """``nodes`` and the annotated nodes in one pattern with them: an annotated node whose output is not
    quantized (no ``output_qspec``) belongs with its annotated users (``conv2d`` -> ``relu``)."""

    def annotation(node: Node) -> Any:  # Any: torchao's QuantizationAnnotation, from node.meta
        return node.meta.get("quantization_annotation")

    def fused(a: Node, b: Node) -> bool:  # a feeds b inside one pattern
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
