"""Patterns static INT8 is known to break, found before quantizing and kept in float up front.

* **A Concat of quantities with different ranges feeding an output**: a detection head's Concat of box
  coordinates (0-320) and class scores (0-1) gets ONE int8 scale and the scores collapse to two or three
  levels (a YOLOv8-style detector lost half its detections while the whole-tensor cosine stayed at 0.998).
  Input ranges more than ``RANGE_RATIO`` apart keep the Concat (and reshapes to the output) float; each input
  keeps its producer's scale.
* **The first op after an integer input** (an embedding's Gather, the Cast/OneHot of ids): kept float, an
  embedding table's rows and a one-hot's levels stay exact.
* **Decomposed LayerNorm and GELU**: quantizing their elementwise ops destroys models that MatMul-only
  quantization keeps intact (findings.md 5); those nodes stay float, the MatMuls around them are quantized.

``onnx_fragile_nodes`` (here) returns ``(node name, why)`` pairs for ``onnx.quant``'s ``nodes_to_exclude``;
the same rules on the other routes' graphs: ``tflite.fragile`` and ``pt2e.fragile``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

RANGE_RATIO = 100.0  # float ranges of a Concat's inputs further apart than this get separate scales
RANGE_SAMPLES = 8  # calibration samples the ranges are measured on
HEAD_DEPTH = 8  # ops walked back from each input of the final Concat (the detection head's post-processing)
PASSTHROUGH = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
STATISTICS = frozenset({"Erf", "Pow", "Sqrt", "Reciprocal"})
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Tanh", "ReduceMean"})
# ops that turn integer ids into float values: kept float where they read an integer input
INTEGER_READERS = frozenset({"Gather", "GatherElements", "GatherND", "OneHot", "Cast", "Equal"})


def _output_concats(graph: onnx.GraphProto, consumers: Mapping[str, list[onnx.NodeProto]]) -> list[tuple[onnx.NodeProto, list[onnx.NodeProto]]]:
    """Concats whose output reaches a graph output through pass-through nodes only, with those nodes."""
    outputs = {o.name for o in graph.output}
    found = []
    for node in graph.node:
        if node.op_type != "Concat" or len(node.input) < 2:
            continue
        path: list[onnx.NodeProto] = []
        current = node
        while True:
            if any(out in outputs for out in current.output):
                found.append((node, path))
                break
            readers = [r for out in current.output for r in consumers.get(out, [])]
            if len(readers) != 1 or readers[0].op_type not in PASSTHROUGH:
                break
            current = readers[0]
            path.append(current)
    return found


def _mixed_range_concats(
    model_path: Path, graph: onnx.GraphProto, concats: Sequence[tuple[onnx.NodeProto, list[onnx.NodeProto]]], feeds: Sequence[Mapping[str, np.ndarray]]
) -> list[tuple[str, str]]:
    from toolkit.conversion.onnx.graph_io import require_onnx, run_outputs

    onnx = require_onnx()
    initializers = {i.name for i in graph.initializer}
    names = sorted({name for concat, _ in concats for name in concat.input if name and name not in initializers})
    if not names or not feeds:
        return []
    model = onnx.load(str(model_path))
    with tempfile.TemporaryDirectory(prefix="edgetk-ranges-") as scratch:
        values = run_outputs(model, names, Path(scratch), feeds[:RANGE_SAMPLES])
    ranges = {n: max((float(np.max(np.abs(v))) for v in values[n] if np.size(v)), default=0.0) for n in names}
    found = []
    for concat, path in concats:
        spans = [ranges.get(name, 0.0) for name in concat.input if name in ranges]
        live = [s for s in spans if s > 0.0]
        if len(live) >= 2 and max(live) > RANGE_RATIO * min(live):
            why = span_why(min(live), max(live))
            found.append((concat.name, f"final Concat {concat.name!r}: {why}"))
            found.extend((p.name, f"between {concat.name!r} and the output") for p in path)
    return found


def _decompositions(graph: onnx.GraphProto, producers: Mapping[str, onnx.NodeProto], consumers: Mapping[str, list[onnx.NodeProto]]) -> list[tuple[str, str]]:
    """The statistics/nonlinear nodes of decomposed LayerNorm/GELU and the elementwise nodes next to them."""
    found: dict[str, str] = {}
    for node in graph.node:
        if node.op_type not in STATISTICS:
            continue
        found.setdefault(node.name, f"{node.op_type} of a decomposed LayerNorm/GELU")
        neighbours = [producers[i] for i in node.input if i in producers]
        neighbours += [c for out in node.output for c in consumers.get(out, [])]
        for other in neighbours:
            if other.op_type in ELEMENTWISE and other.name:
                found.setdefault(other.name, f"{other.op_type} next to {node.op_type} {node.name!r}")
    return list(found.items())


def _integer_input_readers(graph: onnx.GraphProto, consumers: Mapping[str, list[onnx.NodeProto]]) -> list[tuple[str, str]]:
    """The integer-input rule: the first float op after each integer graph input (through integer pass-throughs)."""
    from toolkit.conversion.onnx.graph_io import require_onnx

    proto = require_onnx().TensorProto
    integer = {proto.INT64, proto.INT32, proto.INT16, proto.INT8, proto.UINT8, proto.UINT16, proto.UINT32, proto.UINT64}
    found: list[tuple[str, str]] = []
    for value in graph.input:
        if value.type.tensor_type.elem_type not in integer:
            continue
        pending, seen = [value.name], set()
        while pending:
            tensor = pending.pop()
            for node in consumers.get(tensor, []):
                if node.name in seen:
                    continue
                seen.add(node.name)
                if node.op_type in PASSTHROUGH:  # still the ids, reshaped
                    pending.extend(node.output)
                elif node.op_type in INTEGER_READERS and node.name:
                    found.append((node.name, f"{node.op_type} {node.name!r}: the first op after the integer input "
                                  f"{value.name!r} (kept exact)"))
    return found


def onnx_fragile_nodes(model_path: Path, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[tuple[str, str]]:
    """``(node, why)`` for every node of the top graph that static INT8 should leave float (module docstring)."""
    from toolkit.conversion.onnx.graph_io import graph_maps, require_onnx

    graph = require_onnx().load(str(model_path), load_external_data=False).graph
    producers, consumers = graph_maps(graph.node)
    found: dict[str, str] = {}
    concats = _output_concats(graph, consumers)
    if concats:
        for name, why in _mixed_range_concats(model_path, graph, concats, feeds):
            found.setdefault(name, why)
    for name, why in _decompositions(graph, producers, consumers):
        found.setdefault(name, why)
    for name, why in _integer_input_readers(graph, consumers):
        found.setdefault(name, why)
    return [(name, why) for name, why in found.items() if name]


def span_why(low: float, high: float) -> str:
    """Why a Concat of inputs spanning ``low`` to ``high`` stays float (the notes' wording)."""
    return f"its inputs span {low:.3g} to {high:.3g} (one int8 scale would flatten the small ones)"


def upfront_note(found: Sequence[tuple[str, str]]) -> str:
    """The artifact note that lists the nodes kept float up front, with why (the first six)."""
    return (f"kept in float up front ({len(found)} node(s), known to break in int8): "
            + "; ".join(why for _, why in found[:6]) + ("; ..." if len(found) > 6 else ""))
