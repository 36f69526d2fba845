"""The Concat rule of ``fragile`` on the PyTorch routes, on the float graph ``torch.export`` gives (the graph
``pt2e.quantize`` annotates, so the node names are the ones its exclusion takes).

The ranges cannot come from PT2E's observers: where litert-torch's ``cat`` annotation applies, the cat's inputs
and output share one observer; on the tests' trained detector it did not match the exported cats at all, and
their inputs were observed only behind a quantized op (the box sizes' ``mul``, not the centres' ``add`` nor
the scores' sigmoid). The converter then gave the concatenation the scale of its one quantized input (0.53),
and the scores collapsed to {0, 0.53}. So the float graph is run (a ``torch.fx.Interpreter``) instead.
The other two rules are not needed here: litert-torch's quantizer annotates no ``layer_norm``, ``gelu`` or
``embedding`` node, so they already stay float. ``Any``: FX arguments (a node or a constant) and the values an
Interpreter returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolkit.conversion.fragile import HEAD_DEPTH, RANGE_RATIO, RANGE_SAMPLES, span_why

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor
    from torch.fx import GraphModule, Node

# pass-through ops (slices and splits too: a YOLOv8 head splits its box and score channels out of one tensor)
PT2E_PASSTHROUGH = frozenset({
    "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "flatten", "squeeze", "unsqueeze", "contiguous",
    "clone", "alias", "expand", "unflatten", "slice", "select", "narrow", "split", "split_with_sizes", "getitem",
})
# a detection head's post-processing, as TFLITE_HEAD_OPS (a convolution or linear layer reading a Softmax: the DFL)
PT2E_HEAD_OPS = frozenset({"sigmoid", "softmax", "_softmax", "mul", "add", "sub", "div", "cat"})
PT2E_WEIGHTED = frozenset({"conv1d", "conv2d", "convolution", "linear"})


@dataclass(frozen=True)
class MixedOutput:
    """A graph output written by a mixed-range final cat: it must stay float32 even with int8 I/O."""

    index: int  # position among the graph's (flattened) outputs
    writer: str  # the node that writes it: the cat, or the last pass-through op after it
    why: str


def _fx_op(node: object) -> str:
    """The op of an FX node without its overload (``aten.flatten.using_ints`` -> ``flatten``); '' if none."""
    if getattr(node, "op", None) != "call_function":
        return ""
    target = getattr(node, "target")  # an FX call_function node (its op checked above)
    return str(getattr(target, "__name__", target)).split(".")[0]


def _cat_inputs(cat: Node) -> list[Node]:
    """The inputs of a ``cat`` node that are computed (not constants)."""
    tensors: Any = cat.args[0] if cat.args else ()  # Any: FX arguments, nodes where they have an ``op``
    return [t for t in tensors if getattr(t, "op", None) not in (None, "get_attr")]


def pt2e_output_cats(graph: GraphModule) -> list[tuple[Node, list[Node], int]]:
    """``cat`` nodes of an FX graph module whose output reaches a graph output through pass-through ops only,
    with those ops and the output's index: the Concat rule's candidates (the cheap structural test)."""
    nodes = list(graph.graph.nodes)
    output = next((n for n in nodes if n.op == "output"), None)
    if output is None or not output.args:
        return []
    written = output.args[0]
    flat = list(written) if isinstance(written, (tuple, list)) else [written]
    index = {node: i for i, node in enumerate(flat) if hasattr(node, "op")}
    found = []
    for node in nodes:
        if _fx_op(node) != "cat" or len(_cat_inputs(node)) < 2:
            continue
        path: list[Node] = []
        current = node
        while current not in index:
            users = list(current.users)
            if len(users) != 1 or _fx_op(users[0]) not in PT2E_PASSTHROUGH:
                break
            current = users[0]
            path.append(current)
        if current in index:
            found.append((node, path, index[current]))
    return found


def pt2e_fragile_nodes(
    torch: ModuleType, graph: GraphModule, samples: Sequence[Sequence[Tensor]]
) -> tuple[list[tuple[str, str]], list[MixedOutput]]:
    """``(node, why)`` for the nodes of a float FX graph (``torch.export(...).module()``) that PT2E INT8 should leave
    float, and the outputs that must then stay float: ``fragile``'s Concat rule on the first ``RANGE_SAMPLES`` of
    ``samples`` (argument tuples), with the head behind the cat (``PT2E_HEAD_OPS``, a layer reading a softmax: the
    DFL) up to ``HEAD_DEPTH`` ops back."""
    import torch.fx

    cats = pt2e_output_cats(graph)
    if not cats or not samples:
        return [], []
    peaks = {node: 0.0 for cat, _path, _index in cats for node in _cat_inputs(cat)}

    def watched(n: Node) -> Any:  # Any: as Interpreter.run_node returns
        value = plain(n)
        if n in peaks and isinstance(value, torch.Tensor) and value.numel():
            peaks[n] = max(peaks[n], float(value.detach().abs().max()))
        return value

    with torch.no_grad():
        for args in list(samples)[:RANGE_SAMPLES]:
            interpreter = torch.fx.Interpreter(graph)  # its run_node wrapped: torch is untyped, not subclassed
            plain = interpreter.run_node
            interpreter.run_node = watched
            interpreter.run(*args)
    found: dict[str, str] = {}
    outputs: list[MixedOutput] = []
    for cat, path, index in cats:
        live = [peaks[node] for node in _cat_inputs(cat) if peaks.get(node, 0.0) > 0.0]
        if len(live) < 2 or max(live) <= RANGE_RATIO * min(live):
            continue
        why = span_why(min(live), max(live))
        found.setdefault(cat.name, f"final Concat {cat.name!r}: {why}")
        for node in path:
            found.setdefault(node.name, f"between {cat.name!r} and the output")
        writer = (path[-1] if path else cat).name
        outputs.append(MixedOutput(index, writer, f"it is written by the final Concat {cat.name!r}: {why}"))
        for start in _cat_inputs(cat):
            _pt2e_head_behind(start, found, cat.name)
    return list(found.items()), outputs


def _pt2e_head_behind(start: Node, found: dict[str, str], concat: str) -> None:
    """Mark the post-processing nodes behind ``start`` (an input of the final cat) float, depth-first."""
    pending = [(start, 0)]
    while pending:
        node, depth = pending.pop()
        if depth >= HEAD_DEPTH or getattr(node, "op", None) != "call_function":
            continue
        kind = _fx_op(node)
        dfl = kind in PT2E_WEIGHTED and any(_fx_op(a) in ("softmax", "_softmax") for a in node.all_input_nodes)
        if kind not in PT2E_PASSTHROUGH and kind not in PT2E_HEAD_OPS and not dfl:
            continue
        # pass-through ops too: quantized, they would carry the scores on a scale of their own between float ops
        found.setdefault(node.name, f"{kind} of the detection head's post-processing before {concat!r}")
        pending.extend((a, depth + 1) for a in node.all_input_nodes)
