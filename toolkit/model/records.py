"""The verification records written to the manifest: per output, per slice, and the device's slice checks.

Stdlib only (embedded in :class:`~toolkit.model.artifact.Verification` and
:class:`~toolkit.model.artifact.Golden`). A slice is a group of indices along one axis of one output (for a YOLO head
``[1, 4+C, N]``: the box coordinates ``[:, 0:4, :]`` and the class scores ``[:, 4:4+C, :]``), verified with its
error relative to its own float range, so a score channel drowned by box coordinates cannot hide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import PurePath
from typing import Any, ClassVar


JsonObject = Mapping[str, Any]
"""A free-form JSON object a record carries as it is (metrics, config, a runner's report): Any because its keys
and values are not fixed by the manifest's schema (docs/schemas/convert.md) and are read back unchecked inside."""
JsonDict = dict[str, Any]  # Any: a JSON object being built, for the same reason as JsonObject


class Record:
    """A frozen dataclass whose JSON object is its fields in order, tuples as lists, records as their objects."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # Any: as typeshed declares it for dataclasses

    def to_dict(self) -> JsonDict:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, PurePath):
        return str(value)
    return value.to_dict() if isinstance(value, Record) else value


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/Inf; metrics that are not finite are written as null."""
    return None if value is None or not math.isfinite(value) else float(value)


def _ratio(error: float, float_range: float) -> float:
    """``error`` as a fraction of ``float_range`` (0 for a constant slice matched exactly, inf otherwise)."""
    if not math.isfinite(error):
        return float("nan")
    if float_range > 0:
        return error / float_range
    return 0.0 if error == 0 else float("inf")


def runs_of(indices: list[int] | tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Sorted indices as half-open runs: ``[0, 1, 2, 5]`` -> ``((0, 3), (5, 6))``."""
    runs: list[tuple[int, int]] = []
    for i in sorted(indices):
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return tuple(runs)


def slice_label(output: str, axis: int, rank: int, runs: tuple[tuple[int, int], ...]) -> str:
    """``scores[:, 4:6, :]``: the output's name with numpy-style indices along ``axis``."""
    index = ",".join(f"{a}:{b}" if b - a > 1 else f"{a}" for a, b in runs)
    parts = [":"] * rank
    parts[axis] = index if len(runs) == 1 else "{" + index + "}"
    return f"{output}[{', '.join(parts)}]"


@dataclass(frozen=True)
class SliceMetrics:
    """One slice of one output against the float model's."""

    name: str  # e.g. "output_0[:, 4:6, :]"
    axis: int  # along which axis of one sample's array
    runs: tuple[tuple[int, int], ...]  # half-open index runs along ``axis``
    float_range: float  # max - min of the float outputs in this slice over the eval set
    max_abs_error: float
    mean_abs_error: float

    @property
    def max_error_ratio(self) -> float:
        """The worst absolute error as a fraction of the slice's float range (what the tolerance limits)."""
        return _ratio(self.max_abs_error, self.float_range)

    def to_dict(self) -> JsonDict:
        return {"name": self.name, "axis": self.axis, "runs": [list(r) for r in self.runs],
                "float_range": finite_or_none(self.float_range), "max_abs_error": finite_or_none(self.max_abs_error),
                "mean_abs_error": finite_or_none(self.mean_abs_error), "max_error_ratio": finite_or_none(self.max_error_ratio)}


@dataclass(frozen=True)
class OutputMetrics:
    """One output of the artifact against the float model's, whole and (where its ranges differ) per slice."""

    name: str
    index: int
    max_abs_error: float
    mean_abs_error: float
    cosine_similarity: float
    float_range: float
    slices: tuple[SliceMetrics, ...] = ()  # empty: the output is verified whole
    role: str | None = None  # what the output carries (toolkit.model.roles.Role)
    role_source: str | None = None  # declared where, or inferred: why
    metrics: JsonObject = field(default_factory=dict, hash=False)  # its role's metrics (role_metrics)

    @property
    def max_error_ratio(self) -> float:
        return _ratio(self.max_abs_error, self.float_range)

    def to_dict(self) -> JsonDict:
        return {"name": self.name, "index": self.index, "max_abs_error": finite_or_none(self.max_abs_error),
                "mean_abs_error": finite_or_none(self.mean_abs_error), "cosine_similarity": finite_or_none(self.cosine_similarity),
                "float_range": finite_or_none(self.float_range), "max_error_ratio": finite_or_none(self.max_error_ratio),
                "slices": [s.to_dict() for s in self.slices], "role": self.role, "role_source": self.role_source,
                "metrics": {k: finite_or_none(v) if isinstance(v, float) else v for k, v in self.metrics.items()}}


@dataclass(frozen=True)
class SliceCheck(Record):
    """What the device check compares: one slice of the device's output against the float reference shipped
    in the bundle, failing when the worst error exceeds ``max_error`` times ``float_range``."""

    output: int  # index of the output (golden files key it as output_<index>)
    name: str
    axis: int
    runs: tuple[tuple[int, int], ...]
    float_range: float
    max_error: float  # the tolerance's max_slice_error

