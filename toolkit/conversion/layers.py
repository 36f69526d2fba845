"""The layer-wise error table of full INT8, as data: each quantized layer's output against its float value, layer
by layer on the calibration data, so a user and selective quantization see which layers to keep in float.

Each backend measures it its own way (``Backend.layer_table``: TFLite's quantization debugger, ONNX's Q/DQ pairs,
PT2E's observers) and ranks the rows with :func:`ranked`: by ``channel_error`` (``sensitivity.ChannelError``; why:
see ``sensitivity``); rank 1 is the worst. The table is of the *full* INT8 quantization, written as
``layers/<artifact>.json`` (``tables.bundle_table``), read back here (:func:`read_table`) and shown by ``edgetk
inspect --layers``; ``kept_float`` marks the rows that artifact keeps in float.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any

from toolkit.conversion.sensitivity import Row
from toolkit.delivery.bundle import layer_table_name
from toolkit.model.quantized import names_layer
from toolkit.errors import ConversionError
from toolkit.model.reading import RecordProblem, read_record
from toolkit.model.vocabulary import Format

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


def table_path(bundle: Path, artifact_file: str) -> Path:
    return bundle / layer_table_name(artifact_file)


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
