"""What a model's inputs and outputs are: name, shape, dtype and (for integer tensors) quantization."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Quantization:
    """Affine quantization of one tensor: ``real = scale * (q - zero_point)``; per-axis when ``axis`` is set."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"scale": list(self.scale), "zero_point": list(self.zero_point), "axis": self.axis}


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (None for a dynamic dimension) and dtype (numpy name) of a model input or output."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str
    quantization: Quantization | None = None

    @property
    def is_static(self) -> bool:
        return all(d is not None and d >= 0 for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "quantization": self.quantization.to_dict() if self.quantization else None,
        }


def tensor_specs_to_list(specs: Sequence[TensorSpec]) -> list[dict[str, Any]]:
    return [s.to_dict() for s in specs]
