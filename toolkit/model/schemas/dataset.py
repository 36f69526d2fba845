"""The schema of an image folder's ``dataset.toml`` (calibration/README.md): how the images become the model's
input. Upper or lower case is accepted for layout, colour order; a single number for mean/std means every
channel. Read by :mod:`toolkit.model.reading` (the one engine for records read from files)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from toolkit.model.reading import Before, Rule, Words
from toolkit.model.roles import DECLARABLE
from toolkit.model.tasks import Task

TASKS = tuple(t.value for t in Task)

DOCS = "calibration/README.md"


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def _as_list(value: object) -> object:
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Numbers = Annotated[tuple[float, ...], Before(_as_list)]
Size = Annotated[int, Rule(lambda v: v > 0, lambda v: f"a size must be positive (got {v})",
                           "size = [height, width] in pixels.")]


@dataclass(frozen=True)
class OutputTask:
    """``[outputs.NAME]``: what one output carries (docs/verification.md, "Per-output roles")."""

    task: Annotated[str, Before(_lower), Words(DECLARABLE, "task")]
    blank: Annotated[int, Rule(lambda v: v >= 0, lambda v: f"a class index must be >= 0 (got {v})",
                               "blank = 0 (the CTC blank's class index).")] | None = None


@dataclass(frozen=True)
class Dataset:
    size: Annotated[tuple[Size, ...], Rule(lambda v: len(v) == 2, lambda v: f"must be [height, width] in pixels "
                                           f"(got {list(v)})", "size = [height, width] in pixels.")] | None = None
    layout: Annotated[str, Before(_upper), Words(("NHWC", "NCHW"), "layout")] = "NHWC"
    color_order: Annotated[str, Before(_upper), Words(("RGB", "BGR", "GRAY"), "color_order")] = "RGB"
    mean: Numbers | None = None
    std: Annotated[Numbers, Rule(lambda v: all(x != 0 for x in v), lambda v: "must not be zero",
                                 "Use the standard deviation of the data (e.g. 0.229) or leave std out.")] | None = None
    scale: Annotated[float, Rule(lambda v: v > 0, lambda v: f"must be above 0 (got {v})",
                                 "A positive number, e.g. 0.00392156 for 1/255.")] | None = None
    dtype: Annotated[str, Words(("float32", "float16", "uint8", "int8"), "dtype")] = "float32"
    input: str | None = None  # which model input the images feed (needed when the model has several)
    # what the model does: picks the verification metrics (docs/verification.md); --task wins over it
    task: Annotated[str, Words(TASKS, "task")] | None = None
    # per output, what it carries (its role); --output-task wins over it
    outputs: Mapping[str, OutputTask] | None = None
