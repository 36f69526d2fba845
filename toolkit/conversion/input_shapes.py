"""The model's input shapes for a run: ``--input-shape`` first, then the data, batch 1 by default."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from toolkit.errors import UsageError
from toolkit.model.tensors import TensorSpec

if TYPE_CHECKING:
    from toolkit.conversion.calibration import DataFile


def resolve_shapes(
    inputs: Sequence[TensorSpec],
    *,
    overrides: Mapping[str, tuple[int, ...]],
    data: DataFile | None,
    unknown_rank: Collection[str] = (),
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every input; a dimension nothing settles is an error naming the input and the flag.
    Inputs in ``unknown_rank`` (a TorchScript model records no shapes) take an ``--input-shape`` of any rank."""
    names = [s.name for s in inputs]
    unknown = [n for n in overrides if n not in names]
    if unknown:
        raise UsageError(
            f"--input-shape names {unknown[0]!r}, which is not an input of the model.",
            hint=f"The model's inputs are: {', '.join(names)}.",
        )
    resolved: dict[str, tuple[int, ...]] = {}
    for spec in inputs:
        if spec.name in unknown_rank:
            if spec.name not in overrides:
                raise UsageError(
                    f"The model does not record the shape of its input {spec.name!r}.",
                    hint=f"Pass --input-shape {spec.name}=D0,D1,... (for example {spec.name}=1,3,224,224).",
                )
            resolved[spec.name] = overrides[spec.name]
            continue
        if spec.name in overrides:
            shape = overrides[spec.name]
            if len(shape) != len(spec.shape):
                raise UsageError(
                    f"--input-shape {spec.name}={','.join(map(str, shape))} has rank {len(shape)}, but the input "
                    f"has rank {len(spec.shape)} {_fmt(spec.shape)}.",
                )
            for dim, fixed in zip(shape, spec.shape):
                if fixed is not None and fixed > 0 and dim != fixed:
                    raise UsageError(
                        f"--input-shape {spec.name}={','.join(map(str, shape))} contradicts the model's fixed shape "
                        f"{_fmt(spec.shape)}.",
                    )
            resolved[spec.name] = shape
            continue
        dims: list[int | None] = [d if d is not None and d > 0 else None for d in spec.shape]
        if data is not None and spec.name in data.arrays and None in dims:
            array = data.arrays[spec.name]
            if array.ndim == len(dims) + 1:
                dims = [d if d is not None else int(array.shape[1 + i]) for i, d in enumerate(dims)]
            elif array.ndim == len(dims) and len(dims) > 0:
                dims = [
                    d if d is not None else (1 if i == 0 else int(array.shape[i])) for i, d in enumerate(dims)
                ]
        if dims and dims[0] is None:
            dims[0] = 1
        if None in dims:
            axis = dims.index(None)
            raise UsageError(
                f"The input {spec.name!r} has a dynamic dimension {axis} {_fmt(spec.shape)} that nothing settles.",
                hint=f"Pass --input-shape {spec.name}=" + ",".join(str(d) if d else "N" for d in dims)
                + " or calibration data that fixes it.",
            )
        resolved[spec.name] = tuple(int(d) for d in dims if d is not None)
    return resolved


def _fmt(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("?" if d is None or d < 0 else str(d) for d in shape) + ")"
