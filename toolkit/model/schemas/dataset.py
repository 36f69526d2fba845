"""The schema of an image folder's ``dataset.toml`` (calibration/README.md): how the images become the model's
input. Upper or lower case is accepted for layout, colour order; a single number for mean/std means every
channel."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

from toolkit.model.schemas.fields import Int, Number, Str, Table, above, checked, choice
from toolkit.model.roles import DECLARABLE
from toolkit.model.tasks import Task

TASKS = tuple(t.value for t in Task)

DOCS = "calibration/README.md"


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


def _as_list(value: object) -> object:
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Numbers = Annotated[list[Number], BeforeValidator(_as_list)]


class OutputTask(Table):
    """``[outputs.NAME]``: what one output carries (docs/verification.md, "Per-output roles")."""

    task: Annotated[Str, BeforeValidator(lambda v: v.lower() if isinstance(v, str) else v),
                    choice(DECLARABLE, "task")]
    blank: Annotated[Int, checked(lambda v: v >= 0, lambda v: f"a class index must be >= 0 (got {v})",
                                  "blank = 0 (the CTC blank's class index).")] | None = None


class Dataset(Table):
    size: Annotated[list[Annotated[Int, checked(lambda v: v > 0, lambda v: f"a size must be positive (got {v})",
                                                 "size = [height, width] in pixels.")]],
                    checked(lambda v: len(v) == 2, lambda v: f"must be [height, width] in pixels (got {v})",
                            "size = [height, width] in pixels.")] | None = None
    layout: Annotated[Str, BeforeValidator(_upper), choice(("NHWC", "NCHW"), "layout")] = "NHWC"
    color_order: Annotated[Str, BeforeValidator(_upper), choice(("RGB", "BGR", "GRAY"), "color_order")] = "RGB"
    mean: Numbers | None = None
    std: Annotated[Numbers, checked(lambda v: all(x != 0 for x in v), lambda v: "must not be zero",
                                    "Use the standard deviation of the data (e.g. 0.229) or leave std out.")] | None = None
    scale: Annotated[Number, above(0, "A positive number, e.g. 0.00392156 for 1/255.")] | None = None
    dtype: Annotated[Str, choice(("float32", "float16", "uint8", "int8"), "dtype")] = "float32"
    input: Str | None = None  # which model input the images feed (needed when the model has several)
    # what the model does: picks the verification metrics (docs/verification.md); --task wins over it
    task: Annotated[Str, choice(TASKS, "task")] | None = None
    # per output, what it carries (its role); --output-task wins over it
    outputs: dict[str, OutputTask] | None = None
