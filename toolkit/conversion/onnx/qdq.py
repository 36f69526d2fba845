"""The Q/DQ graph of a static INT8 ONNX artifact, read for the layer table of the ONNX routes
(``layers.onnx_table``): which compute nodes are quantized, where each one's output goes through a
QuantizeLinear/DequantizeLinear pair, and which nodes must stay float together with each (its float group).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from toolkit.conversion import sensitivity
from toolkit.conversion.onnx.graph_io import graph_maps
from toolkit.runtimes.inspection.onnx import iter_nodes

if TYPE_CHECKING:
    import onnx

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def qdq_graph(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]]]:
    """(compute nodes fed through a DequantizeLinear, producer of each tensor, readers of each tensor)."""
    nodes = list(iter_nodes(model.graph))
    producers, readers = graph_maps(nodes)
    compute = [
        n
        for n in nodes
        if n.op_type not in _QDQ
        and n.input
        and producers.get(n.input[0]) is not None
        and producers[n.input[0]].op_type == "DequantizeLinear"
    ]
    return compute, producers, readers


def output_qdq(node: onnx.NodeProto, readers: Mapping[str, list[onnx.NodeProto]]) -> tuple[str, str] | None:
    """(float output, its DequantizeLinear output) when ``node``'s first output goes through a Q/DQ pair."""
    if not node.output:
        return None
    for q in readers.get(node.output[0], []):
        if q.op_type == "QuantizeLinear":
            for dq in readers.get(q.output[0], []):
                if dq.op_type == "DequantizeLinear":
                    return str(node.output[0]), str(dq.output[0])
    return None


# Ops that move or select values: the compute node behind them is the one that would re-quantize a tensor.
_PASSTHROUGH = {
    "Reshape", "Flatten", "Transpose", "MaxPool", "Squeeze", "Unsqueeze", "Concat", "Relu", "Clip", "Slice",
    "Gather", "Split", "Pad", "Resize", "Identity", "DepthToSpace", "SpaceToDepth", "GlobalMaxPool",
}


def float_group_map(quant_model: onnx.ModelProto, names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """For each of ``names`` (quantized nodes of a QDQ model), the node and the compute nodes that read its
    output, through pass-through nodes (``sensitivity.float_group``): what must stay float together."""
    compute, _producers, readers = qdq_graph(quant_model)
    kinds = {n.name: n.op_type for n in compute}
    consumers: dict[str, list[str]] = {}
    for node in [n for n in iter_nodes(quant_model.graph) if n.op_type not in _QDQ]:
        kinds.setdefault(node.name, node.op_type)
        outputs = list(node.output)
        pair = output_qdq(node, readers)
        if pair:
            outputs.append(pair[1])
        consumers[node.name] = [
            r.name for out in outputs for r in readers.get(out, []) if r.op_type not in _QDQ
        ]
    return {name: sensitivity.float_group(name, consumers, lambda n: kinds.get(n) in _PASSTHROUGH) for name in names}
