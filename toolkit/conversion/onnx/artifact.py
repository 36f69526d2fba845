"""What the convert walk reads from a built ``.onnx`` file: its graph cut after each node (for the crash guard),
the source nodes behind the nodes an onnxruntime message names (for the runtime retry), and its layer tensors on
held-out samples (for the layer probe)."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.conversion.graph_cuts import Cuts
from toolkit.conversion.layers import LayerError

if TYPE_CHECKING:
    import onnx

_NODE = re.compile(  # run: "... node. Name:'n'"; load: "Node (n) Op (X)", "... in node (n)", 'In Node, ("n", X'
    r"Name:\s*'([^']+)'|\bNode \(([^)]+)\) Op \(|\bin node \(([^)]+)\)|\bIn Node, \(\"([^\"]+)\",")
_FUSED = re.compile(r"_token_\d+$")  # onnxruntime's name for a node its optimizer fused (a QLinearConv)
_QDQ = ("QuantizeLinear", "DequantizeLinear")


def named_nodes(text: str) -> list[str]:
    """The nodes an onnxruntime error names, in its load and run messages' words."""
    return ["".join(names) for names in _NODE.findall(text)]


def source_nodes(artifact: Path | None, names: Sequence[str]) -> list[str]:
    """The nodes of the source model behind the nodes onnxruntime names in the INT8 ``artifact``: a fused node
    (``conv_1_token_4``) is the node it was fused from, a QuantizeLinear or DequantizeLinear the ops on either
    side of its Q/DQ pair (a weight's DequantizeLinear: the op reading the weight); other nodes keep their name.
    Without the artifact file only fused names are undone."""
    names = [_FUSED.sub("", name) for name in names]
    if artifact is None:
        return names
    from toolkit.runtimes.inspection.onnx import load_onnx

    nodes = list(load_onnx(artifact, load_external_data=False).graph.node)
    by_name = {node.name: node for node in nodes}
    producer = {output: node for node in nodes for output in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found: list[str] = []
    for name in names:
        node = by_name.get(name)
        if node is None or node.op_type not in _QDQ:
            found.append(name)
            continue
        while node.op_type in _QDQ and node.input[0] in producer:  # up the Q/DQ chain to the op it quantizes
            node = producer[node.input[0]]
        found += [node.name] if node.op_type not in _QDQ else []
        tensors = [by_name[name].output[0]]
        while tensors:  # down the chain to the ops that read it
            for reader in readers.get(tensors.pop(), []):
                if reader.op_type in _QDQ:
                    tensors.append(reader.output[0])
                else:
                    found.append(reader.name)
    return found


def cuts(path: Path) -> Cuts:
    """The graph's node list (topologically ordered) cut after each node, each cut named as onnxruntime names a
    failing node (``Conv node. Name:'conv_1'``)."""
    from toolkit.runtimes.inspection.onnx import load_onnx

    model = load_onnx(path)
    nodes = list(model.graph.node)
    return Cuts(len(nodes), lambda k: _cut(model, k),
                lambda k: f"{nodes[k - 1].op_type} node. Name:'{nodes[k - 1].name}'")


def _cut(model: onnx.ModelProto, ops: int) -> bytes:
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


def tensors(path: Path, names: Sequence[str], feeds: Sequence[Mapping[str, np.ndarray]],
            input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """``names`` of the ONNX model at ``path`` over ``feeds`` (float, stacked per sample); absent names left out."""
    from toolkit.conversion.onnx.graph_io import require_onnx, run_outputs

    model = require_onnx().load(str(path))
    known = {o for n in model.graph.node for o in n.output}
    present = [n for n in names if n in known]
    graph_inputs = [i.name for i in model.graph.input]
    renamed = [{g: np.asarray(f[s]) for g, s in zip(graph_inputs, input_names)} for f in feeds]
    with tempfile.TemporaryDirectory() as scratch:
        values = run_outputs(model, present, Path(scratch), renamed)
    return {n: np.stack([np.asarray(v, dtype=np.float32) for v in values[n]]) for n in present}


def graph_order(path: Path, rows: Sequence[LayerError]) -> list[tuple[LayerError, str]]:
    """(table row, tensor name) for the rows whose node the model has, in graph (topological) order."""
    from toolkit.conversion.onnx.graph_io import require_onnx

    model = require_onnx().load(str(path))
    position = {n.name: (i, n.output[0]) for i, n in enumerate(model.graph.node) if n.output}
    found = [(position[r.name][0], r, position[r.name][1]) for r in rows if r.name in position]
    return [(row, tensor) for _, row, tensor in sorted(found, key=lambda item: item[0])]


def with_outputs(source: Path, names: Sequence[str], target: Path) -> None:
    """Write to ``target`` the ONNX model at ``source`` with the tensors ``names`` added as graph outputs."""
    from toolkit.conversion.onnx.graph_io import require_onnx

    onnx = require_onnx()
    model = onnx.load(str(source))
    present = {o.name for o in model.graph.output}
    for name in names:
        if name not in present:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    onnx.save(model, str(target))
