"""What a model's inputs and outputs are: name, shape, dtype and (for integer tensors) quantization."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.model.records import Record


@dataclass(frozen=True)
class Quantization(Record):
    """Affine quantization of one tensor: ``real = scale * (q - zero_point)``; per-axis when ``axis`` is set."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None


@dataclass(frozen=True)
class TensorSpec(Record):
    """Name, shape (None for a dynamic dimension) and dtype (numpy name) of a model input or output."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str
    quantization: Quantization | None = None
