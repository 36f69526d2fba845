"""The nodes of a float graph ranked by the error each adds in its full INT8 quantization (a backend's
``Backend.locate``: ONNX's ``onnx.node_locator``), and the front end of a node: what ``selective`` keeps float when
the node adding the most error is one the layer table has no row for."""

from __future__ import annotations

from dataclasses import dataclass

# ops with no weights whose error depends on where their input lies, not on its range: what the layer table
# cannot see (onnxruntime quantizes none of them, or only their input), and spectral front-end ops
ACTIVATION_ONLY = frozenset({
    "Log", "Exp", "Pow", "Div", "Sqrt", "Reciprocal", "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum",
    "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceMax", "LayerNormalization", "InstanceNormalization",
    "LpNormalization", "MeanVarianceNormalization", "DFT", "STFT", "Erf", "Tanh", "Sigmoid", "Abs",
})


@dataclass(frozen=True)
class NodeError:
    """One node of the float graph: the error of its output in the full INT8 model and the share it adds."""

    name: str
    op_type: str
    error: float  # RMS(int8 - float) / float range of its first output, capped at ``ERROR_CAP``
    added: float  # ``error`` less the worst error among its inputs (0 when it adds none)


@dataclass(frozen=True)
class NodeLocation:
    """The nodes of the float graph ranked by the error they add in full INT8, worst first."""

    nodes: tuple[NodeError, ...]
    names: tuple[str, ...]  # every node of the float graph in graph order ("" for an unnamed one)
    parents: tuple[tuple[int, ...], ...]  # per node, the indices of the nodes that write its inputs
    samples: int

    def front_end(self, name: str) -> tuple[str, ...]:
        """``name`` and every node it depends on, from the graph inputs: the nodes to keep float so that no
        Q/DQ pair stands before it."""
        if name not in self.names:
            return (name,)
        seen: set[int] = set()
        frontier = [self.names.index(name)]
        while frontier:
            index = frontier.pop()
            if index not in seen:
                seen.add(index)
                frontier.extend(self.parents[index])
        return tuple(self.names[i] for i in sorted(seen) if self.names[i])

    def added_errors(self) -> dict[str, float]:
        """Node name -> the error it adds: what ``retry_worth`` weighs a float set with."""
        return {n.name: n.added for n in self.nodes}
