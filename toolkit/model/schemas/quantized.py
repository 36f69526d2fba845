"""The manifest's ``quantized`` object of an artifact (``toolkit.model.quantized.QuantizedShare``), read back.

A manifest written before it existed has none (None: the share was not recorded)."""

from __future__ import annotations

from toolkit.model.quantized import QuantizedShare
from toolkit.model.schemas.fields import Bool, Int, Number, Str, Table


class FloatLayerM(Table):
    name: Str
    op: Str | None = None
    weights: Number | None = None
    macs: Number | None = None
    why: Str | None = None


class QuantizedM(Table):
    weights: Number | None  # null when not finite
    macs: Number | None = None
    mixed: Bool | None = None  # derived when read
    quantized_bytes: Int | None = None
    float_bytes: Int | None = None
    float_layers: list[FloatLayerM] | None = None


def read_quantized(q: QuantizedM | None) -> QuantizedShare | None:
    if q is None or q.weights is None:
        return None
    return QuantizedShare.from_dict(q.model_dump(exclude_none=True))
