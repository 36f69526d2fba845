"""The one Tolerance type: how far an artifact may drift from the float model and still ship as ``ok``.

A target profile's ``[tolerance]`` table is read into it (``toolkit.model.targets``), the convert stage gates every
candidate with it (:func:`toolkit.verification.outputs.verify_outputs`), and the per-slice limit travels in the
manifest to the device check. Stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolkit.errors import UsageError


@dataclass(frozen=True)
class Tolerance:
    """Limits per metric; each applies only where that metric exists for the model's task.

    ``max_top1_drop``: a fraction (0.01 = one point) of top-1 accuracy vs the float model's (with labels), or
    1 - top-1 agreement without labels. ``min_cosine``: the lowest cosine similarity of the outputs (for
    embeddings: the mean per-vector cosine). ``max_slice_error``: the largest absolute error of a slice (a
    channel group of an output whose channels span very different ranges, e.g. box coordinates and scores),
    as a fraction of that slice's float range; the device check applies the same limit. ``min_recall`` /
    ``min_precision``: detections matched against the float model's (score threshold, IoU 0.5).
    ``max_label_recall_drop`` / ``max_label_precision_drop``: with labelled boxes, how far (a fraction: 0.05 =
    five points) the artifact's recall / precision against the labels may fall below the float model's own.
    ``min_mask_iou``: mean IoU of the segmentation map (and of an output's dense map). ``min_box_iou``: mean IoU
    of an output's boxes against the float ones, where its four coordinates decode as boxes. ``max_relative_error``: ``||a - r|| / ||r||`` for
    embeddings and regression outputs. ``min_samples``: the fewest eval samples a verdict is drawn from.
    """

    max_top1_drop: float = 0.01
    min_cosine: float = 0.99
    max_slice_error: float = 0.25
    min_recall: float = 0.9
    min_precision: float = 0.9
    max_label_recall_drop: float = 0.05
    max_label_precision_drop: float = 0.05
    min_mask_iou: float = 0.9
    min_box_iou: float = 0.9
    max_relative_error: float = 0.15
    min_samples: int = 5

    def __post_init__(self) -> None:
        for name in ("max_top1_drop", "max_slice_error", "min_recall", "min_precision", "max_label_recall_drop",
                     "max_label_precision_drop", "min_mask_iou", "min_box_iou"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0 or math.isnan(value):
                raise UsageError(f"tolerance.{name} must be a fraction in [0, 1] (got {value!r}).",
                                 hint=f"Write e.g. {name} = {getattr(Tolerance, name)}.")
        if not isinstance(self.min_cosine, (int, float)) or not -1.0 <= float(self.min_cosine) <= 1.0:
            raise UsageError(f"tolerance.min_cosine must lie in [-1, 1] (got {self.min_cosine!r}).",
                             hint="Write e.g. min_cosine = 0.99.")
        if not isinstance(self.max_relative_error, (int, float)) or not float(self.max_relative_error) >= 0.0:
            raise UsageError(f"tolerance.max_relative_error must be >= 0 (got {self.max_relative_error!r}).",
                             hint="Write e.g. max_relative_error = 0.15.")
        if isinstance(self.min_samples, bool) or not isinstance(self.min_samples, int) or self.min_samples < 1:
            raise UsageError(f"tolerance.min_samples must be a whole number >= 1 (got {self.min_samples!r}).",
                             hint="Write e.g. min_samples = 5.")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The keys a profile's ``[tolerance]`` table may hold."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tolerance:
        """From a profile's (already key-checked) ``[tolerance]`` table; missing keys take the defaults."""
        unknown = sorted(set(data) - set(cls.keys()))
        if unknown:
            raise UsageError(f"Unknown tolerance key(s): {', '.join(unknown)}.",
                             hint=f"Known keys: {', '.join(cls.keys())}.")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                raw = data[f.name]
                values[f.name] = raw if f.name == "min_samples" else float(raw)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
