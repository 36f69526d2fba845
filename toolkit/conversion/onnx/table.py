"""The layer table of the ONNX routes (QDQ): the float tensor before and after each quantized node's output Q/DQ
pair (``qdq_loss_debug``'s activation matching). ``rmse_range`` is the RMSE over the observed range (max - min);
``sqnr_db`` is ``qdq_loss_debug``'s ``qdq_err``.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.layers import LayerTable, ranked
from toolkit.conversion.sensitivity import Row
from toolkit.errors import ConversionError
from toolkit.model.vocabulary import Format


def onnx_table(request: ConversionRequest, int8: BuiltArtifact) -> LayerTable:
    """The table of a QDQ INT8 ONNX artifact: every quantized node's output before/after its Q/DQ pair."""
    from toolkit.conversion.onnx.calibration import reader
    from toolkit.conversion.onnx.graph_io import quiet, require_onnx, run_outputs
    from toolkit.conversion.onnx.qdq import float_group_map, output_qdq, qdq_graph
    from toolkit.conversion.sensitivity import DEBUG_SAMPLES, ChannelError
    from toolkit.runtimes.inspection.onnx import is_integer_op, iter_nodes

    model = require_onnx().load(str(int8.path))
    if any(is_integer_op(n.op_type) for n in iter_nodes(model.graph)):
        raise ConversionError("the artifact is in QOperator format: it keeps no float tensors to compare with")
    compute, _producers, readers = qdq_graph(model)
    pairs = {n.name: (n.op_type, pair) for n in compute if (pair := output_qdq(n, readers)) is not None}
    if not pairs or not request.calibration:
        return LayerTable(Format.ONNX, "no quantized node with an output Q/DQ pair", 0, ())
    names = sorted({t for _, pair in pairs.values() for t in pair})
    feeds = list(reader(request, int8.path, DEBUG_SAMPLES))
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch, quiet():
        values = run_outputs(model, names, Path(scratch).resolve(), feeds)
    groups = float_group_map(model, list(pairs))
    rows: list[Row] = []
    for node, (op, (pre, post)) in pairs.items():
        stats = ChannelError(axis=1)
        before = [np.asarray(v, dtype=np.float64) for v in values[pre]]
        after = [np.asarray(v, dtype=np.float64) for v in values[post]]
        for b, a in zip(before, after):
            stats.add(b if b.ndim >= 2 else b.reshape(1, -1), a if a.ndim >= 2 else a.reshape(1, -1))
        ref = np.concatenate([b.ravel() for b in before]) if before else np.zeros(0)
        act = np.concatenate([a.ravel() for a in after]) if after else np.zeros(0)
        if ref.size == 0 or ref.shape != act.shape:
            rows.append((node, op, math.nan, math.nan, None, groups[node]))
            continue
        noise = float(np.sqrt(np.mean((act - ref) ** 2)))
        span = float(ref.max() - ref.min())
        signal = float(np.sqrt(np.mean(ref**2)))
        sqnr = 20.0 * math.log10(max(signal, 1e-30) / noise) if noise > 0 else math.inf
        rows.append((node, op, stats.score(), noise / span if span > 0 else 0.0, sqnr, groups[node]))
    return LayerTable(
        route=Format.ONNX,
        method="each quantized node's output before vs after its QuantizeLinear/DequantizeLinear pair",
        samples=len(feeds), rows=ranked(rows),
    )


def onnx_full_table(request: ConversionRequest, full: BuiltArtifact | None, base: BuiltArtifact) -> LayerTable:
    """The ONNX routes' table: of ``full`` when it is the full quantization, else (a mixed artifact) of the
    full quantization derived anew from the run's float export ``base``."""
    from toolkit.conversion.onnx import quant

    if full is not None:
        return onnx_table(request, full)
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch:
        return onnx_table(request, quant.derive(request, base, Path(scratch) / "plain-int8.onnx"))
