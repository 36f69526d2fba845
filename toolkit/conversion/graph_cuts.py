"""An artifact's main graph cut after its k-th op, as a file of its own (the graph up to that op, its outputs the
model's), and the bisection over such cuts that ``crash_guard`` uses to name the op a runtime crashes on.

One bisection for every format; a format brings only its cuts (``Cuts``): TFLite cuts the main subgraph's
operator list (and its signature's outputs), ONNX the graph's node list, which ONNX keeps in topological order.
Each cut names its last op as the runtime itself names a failing one, so that ``runtime_retry`` reads it like
the runtime's own message: LiteRT's ``Node number 3 (RESHAPE)``, onnxruntime's ``Conv node. Name:'conv_1'``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.model.vocabulary import Format

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class Cuts:
    """The cuts of one artifact: ``count`` ops; ``cut(k)`` the artifact's bytes with only its first k ops;
    ``name(k)`` how the runtime names the k-th op (1-based: the last op of ``cut(k)``)."""

    count: int
    cut: Callable[[int], bytes]
    name: Callable[[int], str]


def first_failing(count: int, fails: Callable[[int], bool]) -> int | None:
    """The smallest k in 1..count whose cut fails (a prefix that fails keeps failing as ops are added), by
    bisection; None when even the whole graph (``count``) does not fail alone."""
    low, high = 1, count
    while low < high:  # the smallest cut that fails: its last op is the failing one
        middle = (low + high) // 2
        if fails(middle):
            high = middle
        else:
            low = middle + 1
    if count < 1 or (low == count and not fails(count)):
        return None
    return low


def cuts(path: Path, artifact_format: Format) -> Cuts | None:
    """The cuts of the artifact at ``path``; None for a format whose graph is not cut here (``.pte``)."""
    if artifact_format == Format.TFLITE:
        return _tflite_cuts(path)
    if artifact_format == Format.ONNX:
        return _onnx_cuts(path)
    return None


def _tflite_cuts(path: Path) -> Cuts:
    from toolkit.runtimes.inspection import tflite as inspection

    schema = inspection.flatbuffer_schema()
    data = path.read_bytes()
    ops = inspection.main_graph_ops(path)
    return Cuts(len(ops), lambda k: _tflite_cut(schema, schema.ModelT.InitFromPackedBuf(data, 0), k),
                lambda k: f"Node number {k - 1} ({ops[k - 1]})")


def _tflite_cut(schema: Any, model: Any, ops: int) -> bytes:  # Any: generated schema objects
    """``model`` with its main graph's first ``ops`` ops only, the last op's outputs as the model's outputs."""
    import flatbuffers

    graph = model.subgraphs[0]
    graph.operators = graph.operators[:ops]
    graph.outputs = [int(t) for t in graph.operators[-1].outputs if t >= 0]
    for signature in model.signatureDefs or []:
        if signature.subgraphIndex == 0:
            signature.outputs = []
            for t in graph.outputs:
                entry = schema.TensorMapT()
                entry.name, entry.tensorIndex = f"cut_{t}", t
                signature.outputs.append(entry)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _onnx_cuts(path: Path) -> Cuts:
    from toolkit.runtimes.inspection.onnx import load_onnx

    model = load_onnx(path)
    nodes = list(model.graph.node)
    return Cuts(len(nodes), lambda k: _onnx_cut(model, k),
                lambda k: f"{nodes[k - 1].op_type} node. Name:'{nodes[k - 1].name}'")


def _onnx_cut(model: onnx.ModelProto, ops: int) -> bytes:
    """``model`` with its first ``ops`` nodes only, the last node's outputs as the graph's outputs (typed by
    the runtime) and the initializers no kept node reads left out."""
    import onnx

    from toolkit.runtimes.inspection.onnx import iter_nodes

    part = onnx.ModelProto()
    part.CopyFrom(model)
    graph = part.graph
    del graph.node[ops:]
    graph.ClearField("output")
    graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in graph.node[-1].output if name)
    read = {name for node in iter_nodes(graph) for name in node.input}  # bodies read outer initializers too
    kept = [tensor for tensor in graph.initializer if tensor.name in read]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    return bytes(part.SerializeToString())

