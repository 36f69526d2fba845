"""One layer-wise error analysis of full INT8: each quantized layer's output against its float value, layer by
layer on the calibration data, so a user and selective quantization see which layers to keep in float.

* **TFLite** (Keras/SavedModel): one ``QuantizationDebugger`` run (``tflite_debugger.debug_run``); each op runs
  next to a float copy fed the same dequantized input, so a row is that op's *own* error. ``rmse_range`` is the
  debugger's RMSE over the quantized range (``255 * scale``: the tutorial's ``rmse/scale`` / 255).
* **ONNX** (QDQ): the float tensor before and after each quantized node's output Q/DQ pair (``qdq_loss_debug``'s
  activation matching). ``rmse_range`` is the RMSE over the observed range (max - min); ``sqnr_db`` is
  ``qdq_loss_debug``'s ``qdq_err``.

Rows rank by ``channel_error`` (``sensitivity.ChannelError``; why: see ``sensitivity``); rank 1 is the worst.
The table is of the *full* INT8 quantization, written as ``layers/<artifact>.json`` (``bundle_table``) and
shown by ``edgetk inspect --layers``; ``kept_float`` marks the rows that artifact keeps in float.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.sensitivity import Row
from toolkit.delivery.bundle import layer_table_name
from toolkit.model.quantized import names_layer
from toolkit.errors import ConversionError, ToolkitError
from toolkit.model.reading import RecordProblem, read_record
from toolkit.model.vocabulary import Format, Precision

if TYPE_CHECKING:
    from toolkit.conversion.run import Candidate, ConvertRun
    from toolkit.model.recipe import Recipe

INT8_LEVELS = 255.0  # an int8 activation's range in quantization steps


@dataclass(frozen=True)
class LayerError:
    """One quantized layer: how much of its output INT8 loses, relative to its own float values."""

    rank: int  # 1 = the worst layer
    name: str  # op output tensor (TFLite) or node name (ONNX): usable as ``nodes_to_exclude``
    op_type: str
    channel_error: float  # median over live channels of RMS(error) / RMS(float); NaN when not measured
    rmse_range: float  # RMS(error) / the tensor's float range
    sqnr_db: float | None = None  # signal-to-quantization-noise ratio (ONNX only)
    kept_float: bool = False  # the artifact this table describes keeps this layer in float
    # what keeping this layer float takes (``nodes_to_exclude`` names; ``sensitivity.float_group``)
    float_group: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "rank": self.rank, "name": self.name, "op_type": self.op_type,
            "channel_error": _finite(self.channel_error), "rmse_range": _finite(self.rmse_range),
            "sqnr_db": _finite(self.sqnr_db), "kept_float": self.kept_float, "float_group": list(self.float_group),
        }



@dataclass(frozen=True)
class LayerTable:
    """The layer-wise analysis of one INT8 recipe: rows worst first."""

    route: Format  # the artifact format it was measured for
    method: str  # how the rows were measured (one line)
    samples: int  # calibration samples measured
    rows: tuple[LayerError, ...]

    @property
    def worst(self) -> LayerError | None:
        return self.rows[0] if self.rows else None

    def with_float(self, float_nodes: Sequence[str]) -> LayerTable:
        kept = set(float_nodes)
        rows = tuple(dataclasses.replace(r, kept_float=names_layer(r.name, kept)) for r in self.rows)
        return dataclasses.replace(self, rows=rows)

    def to_dict(self) -> dict[str, object]:
        return {"route": self.route, "method": self.method, "samples": self.samples,
                "layers": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerTable:  # Any: JSON values
        """Read back; its rows are written as ``layers``."""
        rows = data.get("layers", ())
        return cls(route=Format(data["route"]), method=str(data.get("method", "")), samples=int(data.get("samples", 0)),
                   rows=tuple(read_record(LayerError, r, docs="docs/schemas/inspect.md") for r in rows) if isinstance(rows, list) else ())


# a route's ``layer_table``: (the request of the full INT8 recipe, its artifact when built in full) -> the table
TableFunction = Callable[[ConversionRequest, BuiltArtifact | None], LayerTable]


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def ranked(scores: Sequence[Row]) -> tuple[LayerError, ...]:
    """(name, op, channel_error, rmse_range, sqnr) rows, given in graph order, ordered worst first by channel
    error; within 2% of each other (two lost layers both score ~1) the earlier layer in the graph first, since
    what it loses reaches every layer after it. Rows without a channel error follow, by range-relative error."""

    def key(row: Row) -> tuple[int, float]:
        channel, rng = row[2], row[3]
        if math.isnan(channel):
            return (1, -(0.0 if math.isnan(rng) else rng))
        return (0, -round(math.log10(max(channel, 1e-12)) / 0.0086))

    rows = sorted(scores, key=key)
    return tuple(LayerError(i + 1, name, op, ch, rr, sq, float_group=group)
                 for i, (name, op, ch, rr, sq, group) in enumerate(rows))


# --------------------------------------------------------------------------------------------- TFLite


def tflite_table(request: ConversionRequest, full: BuiltArtifact | None = None) -> LayerTable:
    """The table of a Keras/SavedModel -> TFLite INT8 recipe (one quantization-debugger run, which quantizes
    anew: ``full`` is not read)."""
    from toolkit.conversion.tflite import debugger as tflite_debugger
    from toolkit.conversion.sensitivity import DEBUG_SAMPLES, float_group

    calibrated, channel, steps = tflite_debugger.debug_run(request)
    ops, consumers = tflite_debugger.op_graph(calibrated)
    kinds = {name: kind for kind, name in ops}
    position = {name: index for index, (_kind, name) in enumerate(ops)}  # execution order

    def op_of(tensor: str) -> str:
        if tensor in kinds:
            return tensor
        prefixed = [n for n in kinds if tensor.startswith(n) and tensor[len(n):].isdigit()]
        return max(prefixed, key=len) if prefixed else ""

    names = sorted(dict.fromkeys([*channel, *steps]), key=lambda n: position.get(op_of(n), len(position)))
    def group(name: str) -> tuple[str, ...]:
        op = op_of(name)
        return float_group(op, consumers, lambda o: kinds.get(o) in tflite_debugger.PASSTHROUGH) if op else (name,)

    rows: list[Row] = [(name, kinds.get(op_of(name), ""), channel.get(name, math.nan),
                        steps.get(name, math.nan) / INT8_LEVELS, None, group(name)) for name in names]
    return LayerTable(
        route=Format.TFLITE,
        method="TFLite QuantizationDebugger: each op's int8 output vs its float copy fed the same input",
        samples=min(DEBUG_SAMPLES, len(request.calibration)), rows=ranked(rows),
    )


# --------------------------------------------------------------------------------------------- ONNX


def pt2e_table(request: ConversionRequest, full: BuiltArtifact | None = None) -> LayerTable:
    """The PyTorch -> TFLite and -> ExecuTorch routes' table: PT2E's own measurement (``pt2e_layers.layer_rows``,
    with the route's quantizer: litert-torch's or XNNPACK's; ``full`` is not read)."""
    from toolkit.conversion.pt2e import layers as pt2e_layers

    rows, samples = pt2e_layers.layer_rows(request)
    return LayerTable(route=Format(request.recipe.format), method=pt2e_layers.TABLE_METHOD, samples=samples,
                      rows=ranked(rows))


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


# --------------------------------------------------------------------------------------------- bundles


def onnx_full_table(request: ConversionRequest, full: BuiltArtifact | None) -> LayerTable:
    """The ONNX routes' table: of ``full`` when it is the full quantization, else (a mixed artifact) of the
    full quantization derived anew from the run's float export."""
    from toolkit.conversion import registry
    from toolkit.conversion.onnx import quant as onnx_quant

    if full is not None:
        return onnx_table(request, full)
    base = registry.fp32_onnx(request)
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch:
        return onnx_table(request, onnx_quant.derive(request, base, Path(scratch) / "plain-int8.onnx"))


def table_for(run: ConvertRun, recipe: Recipe, built: BuiltArtifact) -> LayerTable:
    """The table of ``recipe`` quantized in full (``nodes_to_exclude`` dropped), measured once per run by its route's
    ``layer_table`` and shared by selective quantization and the bundle (ONNX: ``built`` when it is the full one)."""
    from toolkit.conversion import cache
    from toolkit.conversion.routes import resolve, route

    plain = dataclasses.replace(recipe, nodes_to_exclude=())
    key = cache.recipe_key(plain)
    cached = run.layer_tables.get(key)
    if isinstance(cached, LayerTable):
        return cached
    row = route(run.source.framework, recipe.format)
    if row is None or row.layer_table is None:
        raise ConversionError(f"not available for {run.source.framework} sources (Keras/SavedModel/PyTorch only)")
    measure = cast(TableFunction, resolve(row.layer_table))
    table = measure(run.request(plain), None if recipe.nodes_to_exclude else built)
    run.layer_tables[key] = table
    return table


def table_path(bundle: Path, artifact_file: str) -> Path:
    return bundle / layer_table_name(artifact_file)


def bundle_table(run: ConvertRun, item: Candidate, staging: Path) -> str | None:
    """Write ``layers/<artifact>.json`` for an INT8 artifact; the note for its record (None: not INT8). A failed
    analysis never costs the artifact: the note says why the table is missing."""
    from toolkit.quiet import native_stderr_silenced

    if item.recipe.precision != Precision.INT8 or not run.data.calibration.feeds:
        return None
    file = item.record.file
    try:
        with native_stderr_silenced():
            table = table_for(run, item.recipe, item.built).with_float(item.record.float_nodes)
    except ToolkitError as exc:
        return f"no layer-wise error table: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - a framework's own error: the artifact stays, the table is missing
        return f"no layer-wise error table: {type(exc).__name__}: {str(exc)[:200]}"
    path = table_path(staging, file)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(table.to_dict(), indent=1) + "\n")
    worst = table.worst
    summary = f" (worst: {worst.name} {worst.op_type}, channel error {worst.channel_error:.3g})" if worst else ""
    kind = "A16W8" if item.recipe.a16w8 else "int8"
    return f"layer-wise {kind} error table: {layer_table_name(file)}{summary}"


def read_table(bundle: Path, artifact_file: str) -> LayerTable | None:
    path = table_path(bundle, artifact_file)
    if not path.is_file():
        return None
    try:
        return LayerTable.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, RecordProblem) as exc:
        raise ConversionError(f"{path} is not a layer-wise error table: {exc}",
                              hint="Convert the bundle again to rewrite it.") from None


def table_text(artifact_file: str, table: LayerTable, *, limit: int = 15) -> str:
    """The table as ``edgetk inspect --layers`` prints it: the worst ``limit`` layers."""
    lines = [f"{artifact_file}: layer-wise int8 error ({table.method}; {table.samples} calibration samples)",
             f"  {'rank':>4}  {'channel err':>11}  {'rmse/range':>10}  {'op':<18} layer"]
    for row in table.rows[:limit]:
        channel = "-" if math.isnan(row.channel_error) else f"{row.channel_error:.3g}"
        rng = "-" if math.isnan(row.rmse_range) else f"{row.rmse_range:.3g}"
        lines.append(f"  {row.rank:>4}  {channel:>11}  {rng:>10}  {row.op_type:<18} {row.name}"
                     + ("  (kept float)" if row.kept_float else ""))
    if len(table.rows) > limit:
        lines.append(f"  ... {len(table.rows) - limit} more (--json has them all)")
    return "\n".join(lines)
