"""Which nodes of a static INT8 ONNX artifact to keep in float: per-node error attribution (``node_errors``,
``added_errors``) and the search for the groups that bring the outputs back (``float_groups``), the ONNX side of
``sensitivity``; ``layers.onnx_table`` shares its reading of the Q/DQ graph.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.conversion import sensitivity
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.onnx_calibration import preprocessed, reader
from toolkit.conversion.onnx_checks import failure
from toolkit.conversion.onnx_io import graph_maps, quiet, require_onnx, run_outputs, session
from toolkit.conversion.onnx_quant import static_int8
from toolkit.runtimes.inspection.onnx import is_integer_op, iter_nodes

if TYPE_CHECKING:
    import onnx

_MAX_DEBUG_SAMPLES = 4  # calibration samples of ``added_errors``' activation runs
_QDQ = ("QuantizeLinear", "DequantizeLinear")
_MEASURING = "Measuring per-node quantization error failed"


def _rel_error(reference: Sequence[np.ndarray], actual: Sequence[np.ndarray]) -> float:
    ref = np.concatenate([np.asarray(r, dtype=np.float64).ravel() for r in reference])
    act = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in actual])
    if ref.shape != act.shape:
        return math.nan
    return float(np.linalg.norm(ref - act)) / max(float(np.linalg.norm(ref)), 1e-12)


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


def _channel_errors(request: ConversionRequest, int8_path: Path, scratch: Path) -> dict[str, float]:
    """Per quantized node: the error its output's Q/DQ pair adds, per channel (axis 1) relative to that
    channel's own magnitude, median over live channels (``sensitivity.ChannelError``)."""
    quant_model = require_onnx().load(str(int8_path))
    compute, _producers, readers = qdq_graph(quant_model)
    pairs = {n.name: pair for n in compute if (pair := output_qdq(n, readers)) is not None}
    if not pairs:
        return {}
    names = sorted({t for pair in pairs.values() for t in pair})
    feeds = list(reader(request, int8_path, sensitivity.DEBUG_SAMPLES))
    values = run_outputs(quant_model, names, scratch, feeds)
    scores: dict[str, float] = {}
    for node, (pre, post) in pairs.items():
        stats = sensitivity.ChannelError(axis=1)
        for before, after in zip(values[pre], values[post]):
            stats.add(before if before.ndim >= 2 else before.reshape(1, -1), after if after.ndim >= 2 else after.reshape(1, -1))
        scores[node] = stats.score()
    return scores


def node_errors(
    request: ConversionRequest, base: BuiltArtifact, int8: BuiltArtifact, *, limit: int
) -> list[tuple[str, float]]:
    """The quantized nodes of a QDQ ``int8`` artifact whose output quantization loses most, worst first: the error
    the Q/DQ pair on each output adds (``sensitivity.ChannelError``) over a few calibration samples. Nodes without
    an output Q/DQ pair are ranked by ``added_errors``. A QOperator artifact renames its nodes and keeps no float
    intermediates, so it gives an empty list."""
    quant_model = require_onnx().load(str(int8.path))
    if any(is_integer_op(n.op_type) for n in iter_nodes(quant_model.graph)) or not request.calibration or limit <= 0:
        return []
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch:
        try:
            with quiet():
                channel = _channel_errors(request, int8.path, Path(scratch).resolve())
        except Exception as exc:
            raise failure(_MEASURING, exc) from exc
    added = added_errors(request, base, int8, limit=0)
    rows = [(name, score) for name, score in channel.items() if not math.isnan(score)]
    rows += [(name, score) for name, score in added if name not in channel or math.isnan(channel[name])]
    rows.sort(key=lambda item: item[1], reverse=True)
    return rows[:limit]


# Ops that move or select values: the compute node behind them is the one that would re-quantize a tensor.
_PASSTHROUGH = {
    "Reshape", "Flatten", "Transpose", "MaxPool", "Squeeze", "Unsqueeze", "Concat", "Relu", "Clip", "Slice",
    "Gather", "Split", "Pad", "Resize", "Identity", "DepthToSpace", "SpaceToDepth", "GlobalMaxPool",
}
_SENSITIVITY_CALIBRATION = 64  # calibration samples for each candidate build (ranges only need to be close)


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


def float_groups(
    request: ConversionRequest, base: BuiltArtifact, int8: BuiltArtifact, *, limit: int
) -> list[tuple[tuple[str, ...], float]]:
    """The groups of nodes worth keeping in float, best first: (node names, output error), as
    ``tflite_debugger.float_groups`` does; shortlisted by ``node_errors`` and ``added_errors``, calibrated on at most
    64 samples, ordered by output error against the fp32 base."""
    ranked = node_errors(request, base, int8, limit=10_000)
    if not ranked:
        return []
    added = added_errors(request, base, int8, limit=10_000)
    culprits = sensitivity.shortlist(ranked, added)
    groups = float_group_map(require_onnx().load(str(int8.path)), culprits)
    feeds = list(reader(request, base.path, sensitivity.SENSITIVITY_SAMPLES))
    reference = [[np.asarray(o) for o in session(base.path).run(None, feed)] for feed in feeds]
    small = dataclasses.replace(request, calibration=request.calibration[:_SENSITIVITY_CALIBRATION])
    measured: dict[tuple[str, ...], float] = {}
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch:
        for index, group in enumerate(sensitivity.candidates(culprits, groups)):
            candidate = dataclasses.replace(small, recipe=dataclasses.replace(request.recipe, nodes_to_exclude=group))
            path = Path(scratch) / f"candidate{index}.onnx"
            try:
                static_int8(candidate, base, path)
                runner = session(path)
                outputs = [[np.asarray(o) for o in runner.run(None, feed)] for feed in feeds]
            except Exception:  # noqa: BLE001, S112 (a candidate that does not build or run is not a candidate)
                continue
            measured[group] = sensitivity.output_error(reference, outputs)
    return sensitivity.order(measured, limit=limit)


def added_errors(
    request: ConversionRequest, base: BuiltArtifact, int8: BuiltArtifact, *, limit: int
) -> list[tuple[str, float]]:
    """The quantized nodes of a QDQ ``int8`` artifact that add the most error, worst first (all when ``limit`` is 0):
    the relative L2 error of each output against float, minus the largest such error among its inputs."""
    quant_model = require_onnx().load(str(int8.path))
    if any(is_integer_op(n.op_type) for n in iter_nodes(quant_model.graph)) or not request.calibration or limit < 0:
        return []
    compute, producers, _readers = qdq_graph(quant_model)
    reference = preprocessed(request, base, []).resolve()
    float_acts, quant_acts = _activations(request, reference, int8.path)
    cache: dict[str, float] = {}

    def error(name: str) -> float:
        if name not in cache:
            found = name in float_acts and name in quant_acts
            cache[name] = _rel_error(float_acts[name], quant_acts[name]) if found else math.nan
        return cache[name]

    results: list[tuple[str, float]] = []
    for node in compute:
        out = error(node.output[0]) if node.output else math.nan
        if math.isnan(out):
            continue
        upstream = [error(_float_input(name, producers)) for name in node.input if name]
        upstream = [e for e in upstream if not math.isnan(e)]
        results.append((node.name, max(0.0, out - max(upstream, default=0.0))))
    results.sort(key=lambda item: item[1], reverse=True)
    return results[:limit] if limit > 0 else results


def _float_input(name: str, producers: Mapping[str, onnx.NodeProto]) -> str:
    """The float tensor behind a DequantizeLinear(QuantizeLinear(x)) chain, else the name itself."""
    dq = producers.get(name)
    if dq is not None and dq.op_type == "DequantizeLinear":
        q = producers.get(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            return str(q.input[0])
    return name


def _activations(
    request: ConversionRequest, reference: Path, int8_path: Path
) -> tuple[dict[str, list[np.ndarray]], dict[str, list[np.ndarray]]]:
    """Every intermediate tensor of the float ``reference`` and of the int8 model, on a few calibration
    samples (onnxruntime's ``qdq_loss_debug``)."""
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        modify_model_output_intermediate_tensors,
    )

    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch:
        float_aug = Path(scratch).resolve() / "float.aug.onnx"
        quant_aug = Path(scratch).resolve() / "quant.aug.onnx"
        try:
            with quiet():
                modify_model_output_intermediate_tensors(str(reference.resolve()), str(float_aug))
                modify_model_output_intermediate_tensors(str(int8_path.resolve()), str(quant_aug))
                float_acts = collect_activations(str(float_aug), reader(request, reference, _MAX_DEBUG_SAMPLES))
                quant_acts = collect_activations(str(quant_aug), reader(request, reference, _MAX_DEBUG_SAMPLES))
        except Exception as exc:
            raise failure(_MEASURING, exc) from exc
    return float_acts, quant_acts
