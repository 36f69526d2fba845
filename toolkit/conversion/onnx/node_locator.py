"""Where full INT8 ONNX loses the model, node by node, the activation-only nodes included.

The layer table (``layers.onnx_table``) compares each *quantized* node's output before and after its own Q/DQ
pair. A node onnxruntime does not quantize (Log, Exp, Sqrt, Div, ReduceMean, Softmax...) has no row there, and
a quantized node's row shows only its own rounding, not what a later nonlinearity makes of it: an 8-bit power
spectrum loses a fraction of a percent of its range, but every weak bin rounds to zero and the ``Log`` after it
turns that into the model's largest error (issue 34's quality regressor; its five selective retries kept
convolutions float, never those nodes).

So the locator runs the float model and its full INT8 artifact on the same calibration samples and compares
every float tensor they share (the quantizer keeps each node's output name; its Q/DQ pairs come after). A
node's *added* error is its output's error (RMS over the float range) less the worst of its inputs': the
Q/DQ rounding on its inputs, its weights' rounding and what its op makes of them. Nodes rank by added error,
worst first. The **front end** of a node is the node and everything it depends on, from the graph inputs
(its ancestors): keeping it float leaves no Q/DQ pair before the node, which is what a ``Log`` of an 8-bit
power spectrum needs (the spectrum's own nodes float, the head after it quantized).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.node_ranking import NodeError, NodeLocation

if TYPE_CHECKING:
    import onnx

ERROR_CAP = 10.0  # a tensor's error over its float range is counted up to this (a Log of zero is infinite)
LOCATOR_SAMPLES = 16  # calibration samples both models run
@dataclass
class _Gap:
    """The running error of one tensor over samples: squared error, count, the float values' range."""

    squared: float = 0.0
    count: int = 0
    low: float = math.inf
    high: float = -math.inf
    finite: bool = True

    def add(self, actual: np.ndarray, want: np.ndarray) -> None:
        a, w = np.asarray(actual, dtype=np.float64).ravel(), np.asarray(want, dtype=np.float64).ravel()
        if a.size != w.size or a.size == 0:
            self.finite = self.finite and a.size == w.size
            return
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(w))):
            self.finite = False
            return
        self.squared += float(np.sum((a - w) ** 2))
        self.count += a.size
        self.low, self.high = min(self.low, float(w.min())), max(self.high, float(w.max()))

    def error(self) -> float:
        """RMS error over the float range, capped at ``ERROR_CAP`` (non-finite values count as the cap); NaN
        when nothing comparable was seen."""
        if not self.finite:
            return ERROR_CAP
        if self.count == 0:
            return math.nan
        noise, span = math.sqrt(self.squared / self.count), self.high - self.low
        if span <= 0:
            return 0.0 if noise == 0 else ERROR_CAP
        return min(noise / span, ERROR_CAP)


def locate(request: ConversionRequest, float_model: Path, int8: BuiltArtifact) -> NodeLocation:
    """Rank the nodes of ``float_model`` (the model the quantizer was given) by the error each adds in ``int8``
    (its full static INT8 QDQ artifact), on the first ``LOCATOR_SAMPLES`` calibration samples (one sample's
    tensors held at a time)."""
    from toolkit.conversion.onnx.calibration import reader
    from toolkit.conversion.onnx.graph_io import quiet, require_onnx

    onnx = require_onnx()
    reference = onnx.shape_inference.infer_shapes(onnx.load(str(float_model)), strict_mode=False)
    quantized = onnx.load(str(int8.path))
    nodes = list(reference.graph.node)
    in_int8 = {o for n in quantized.graph.node for o in n.output}
    floats = _float_tensors(reference)
    measured = [n.output[0] for n in nodes if n.output and n.output[0] in floats and n.output[0] in in_int8]
    feeds = list(reader(request, float_model, LOCATOR_SAMPLES))
    gaps = {t: _Gap() for t in measured}
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch, quiet():
        want_run = _with_outputs(reference, measured, Path(scratch) / "float.onnx")
        got_run = _with_outputs(quantized, measured, Path(scratch) / "int8.onnx")
        for feed in feeds:
            for name, want, got in zip(measured, want_run.run(measured, dict(feed)), got_run.run(measured, dict(feed))):
                gaps[name].add(got, want)
    error = {t: gap.error() for t, gap in gaps.items()}
    ranked = []
    for node in nodes:
        out = node.output[0] if node.output else ""
        if out not in error or math.isnan(error[out]):
            continue
        before = max((error.get(i, 0.0) for i in node.input if i), default=0.0)
        before = 0.0 if math.isnan(before) else before
        ranked.append(NodeError(node.name, node.op_type, error[out], max(error[out] - before, 0.0)))
    ranked.sort(key=lambda n: -n.added)  # stable: the earlier node first among equals
    return NodeLocation(tuple(ranked), tuple(n.name for n in nodes), _parents(nodes), len(feeds))


def _with_outputs(model: onnx.ModelProto, names: Sequence[str], path: Path) -> Any:
    """A session (unoptimized: Q/DQ pairs kept) of ``model`` with the float tensors ``names`` as outputs
    (Any: onnxruntime is untyped)."""
    from toolkit.conversion.onnx.graph_io import require_onnx, save_model, session

    onnx = require_onnx()
    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    present = {o.name for o in augmented.graph.output}
    augmented.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                                  for n in names if n not in present)
    save_model(augmented, path, final_name=path.name)
    return session(path, optimize=False)


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    """The tensors of ``model`` (after shape inference) known to be float32."""
    from toolkit.conversion.onnx.graph_io import require_onnx

    graph, float32 = model.graph, require_onnx().TensorProto.FLOAT
    return {vi.name for vi in [*graph.value_info, *graph.output] if vi.type.tensor_type.elem_type == float32}


def _parents(nodes: Sequence[onnx.NodeProto]) -> tuple[tuple[int, ...], ...]:
    """Per node (graph order), the indices of the nodes that write its inputs."""
    producer: dict[str, int] = {}
    parents = []
    for index, node in enumerate(nodes):
        parents.append(tuple(dict.fromkeys(producer[i] for i in node.input if i in producer)))
        producer.update((out, index) for out in node.output)
    return tuple(parents)


def locate_full(request: ConversionRequest, full: BuiltArtifact | None, base: BuiltArtifact) -> NodeLocation:
    """``locate`` for an ONNX route's INT8 recipe: against the float model its quantizer takes (prepared from the
    run's float export ``base``), with ``full`` when given (the recipe's artifact excludes nothing), else with the
    full quantization derived anew."""
    from toolkit.conversion.onnx import quant as onnx_quant
    from toolkit.conversion.onnx.calibration import preprocessed

    source = preprocessed(request, base, [])
    if full is not None:
        return locate(request, source, full)
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch:
        return locate(request, source, onnx_quant.derive(request, base, Path(scratch) / "plain-int8.onnx"))
