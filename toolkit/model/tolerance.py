"""The one Tolerance type: how far an artifact may drift from the float model and still ship as ``ok``.

A target profile's ``[tolerance]`` table is read into it (``toolkit.model.targets``), the convert stage gates every
candidate with it (:func:`toolkit.verification.outputs.verify_outputs`), and the per-slice limit travels in the
manifest to the device check. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from toolkit.errors import UsageError
from toolkit.model.reading import REQUIRED, Rule
from toolkit.model.records import JsonDict, JsonObject, Record


@dataclass(frozen=True)
class Limit:
    """The values one tolerance key admits (inclusive), written once: :class:`Tolerance` checks them when built
    and the engine that reads a profile's ``[tolerance]`` table (:mod:`toolkit.model.reading`) as its rule."""

    low: float
    high: float | None  # None: no upper bound
    fix: str  # what a refusal suggests
    whole: bool = False  # a count: a whole number, not any number

    @property
    def words(self) -> str:
        """What the value must be, as the refusal says it: ``a fraction in [0, 1]``, ``at least 1``..."""
        if self.high is None:
            return f"at least {self.low:g}" if self.whole else f">= {self.low:g}"
        return f"{'a fraction in' if self.low == 0 else 'within'} [{self.low:g}, {self.high:g}]"

    def admits(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if self.whole else (int, float)):
            return False
        number = float(value)
        return self.low <= number and (self.high is None or number <= self.high)  # NaN fails both

    @property
    def rule(self) -> Rule:
        """The limit as the rule of a field the engine reads."""
        return Rule(self.admits, lambda v: f"must be {self.words} (got {v})", self.fix)


def _fraction(fix: str) -> Limit:
    return Limit(0.0, 1.0, fix)


LIMITS: Mapping[str, Limit] = {
    "max_top1_drop": _fraction("0.01 means one percentage point of top-1."),
    "min_cosine": Limit(-1.0, 1.0, "A cosine similarity such as 0.99."),
    "max_slice_error": _fraction("0.25: a slice may err by a quarter of its float range."),
    "min_recall": _fraction("0.9: detections found vs the float model's."),
    "min_precision": _fraction("0.9: detections matched to the float model's."),
    "max_label_recall_drop": _fraction("0.05: recall vs the labels may fall 5 points below the float model's."),
    "max_label_precision_drop": _fraction(
        "0.05: precision vs the labels may fall 5 points below the float model's."),
    "min_mask_iou": _fraction("0.9: mask IoU vs the float model's."),
    "min_box_iou": _fraction("0.9: box IoU vs the float model's."),
    "min_detection_iou": _fraction("0.8: mean IoU of a raw head's detections matched to the float model's."),
    "max_relative_error": Limit(0.0, None, "e.g. max_relative_error = 0.15."),
    "max_ordinal_error": Limit(0.0, None, "In bins, at the 95th percentile of the decoded values, e.g. 0.5."),
    "min_samples": Limit(1, None, "The fewest eval samples a verdict is drawn from, e.g. 5.", whole=True),
}


@dataclass(frozen=True)
class Tolerance(Record):
    """Limits per metric; each applies only where that metric exists for the model's task (the keys and
    their metrics: docs/verification.md). ``max_top1_drop`` is a fraction (0.01 = one point) of top-1 accuracy vs
    the float model's with labels, else 1 - top-1 agreement; ``max_slice_error`` is a fraction of the slice's float
    range, and the device check applies the same limit; ``min_samples``: the fewest eval samples a verdict is drawn
    from.
    """

    # a profile must write the first two (REQUIRED); the check policy reports them
    max_top1_drop: Annotated[float, REQUIRED, LIMITS["max_top1_drop"].rule] = 0.01
    min_cosine: Annotated[float, REQUIRED, LIMITS["min_cosine"].rule] = 0.99
    max_slice_error: Annotated[float, LIMITS["max_slice_error"].rule] = 0.25
    min_recall: Annotated[float, LIMITS["min_recall"].rule] = 0.9
    min_precision: Annotated[float, LIMITS["min_precision"].rule] = 0.9
    max_label_recall_drop: Annotated[float, LIMITS["max_label_recall_drop"].rule] = 0.05
    max_label_precision_drop: Annotated[float, LIMITS["max_label_precision_drop"].rule] = 0.05
    min_mask_iou: Annotated[float, LIMITS["min_mask_iou"].rule] = 0.9
    min_box_iou: Annotated[float, LIMITS["min_box_iou"].rule] = 0.9
    min_detection_iou: Annotated[float, LIMITS["min_detection_iou"].rule] = 0.8  # raw head: matched IoU
    max_relative_error: Annotated[float, LIMITS["max_relative_error"].rule] = 0.15
    # an ordinal output's decoded value, in bins, 95th percentile
    max_ordinal_error: Annotated[float, LIMITS["max_ordinal_error"].rule] = 0.5
    min_samples: Annotated[int, LIMITS["min_samples"].rule] = 5

    def __post_init__(self) -> None:
        for name, limit in LIMITS.items():
            value = getattr(self, name)
            if not limit.admits(value):
                raise UsageError(f"tolerance.{name} must be {limit.words} (got {value!r}).", hint=limit.fix)

    @classmethod
    def from_dict(cls, data: JsonObject) -> Tolerance:
        """From a profile's (already key-checked) ``[tolerance]`` table; missing keys take the defaults."""
        unknown = sorted(set(data) - set(LIMITS))
        if unknown:
            raise UsageError(f"Unknown tolerance key(s): {', '.join(unknown)}.",
                             hint=f"Known keys: {', '.join(LIMITS)}.")
        values: JsonDict = {key: value if LIMITS[key].whole else float(value) for key, value in data.items()}
        return cls(**values)
