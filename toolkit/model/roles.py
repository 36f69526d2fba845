"""Each output's role (what it carries): the vocabulary and the user's declarations (``[outputs.NAME] task =
"..."`` in dataset.toml, ``--output-task NAME=TASK``); inference from the float values is
:mod:`toolkit.verification.inference`.

A model's outputs are judged one by one: a face stage's box offsets by their error against their range, its
landmarks against their spread, its face probability by decision agreement; a CTC recognizer's ``[1, T, C]``
by per-step agreement and the decoded strings. The metrics are in :mod:`toolkit.verification.role_metrics`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from toolkit.errors import UsageError
from toolkit.model.records import JsonObject


class Role(StrEnum):
    CLASSIFICATION = "classification"  # probabilities or logits over classes: top-1 / top-k agreement
    BOXES = "boxes"  # box coordinates or offsets: error against their range, IoU where they decode
    LANDMARKS = "landmarks"  # keypoint coordinates: error against their spread over the eval set
    DENSE = "dense"  # a map over positions: argmax agreement / IoU with a class axis, else relative error
    SEQUENCE = "sequence"  # [T, C] per-step classes: per-step agreement, greedy CTC strings with a blank
    EMBEDDING = "embedding"  # a vector compared by direction: cosine
    REGRESSION = "regression"  # plain values: relative error
    DETECTION = "detection"  # a detector's boxes or scores, judged together by the detection metrics
    STATE = "state"  # a recurrent model's state, judged over the sequence with the state fed back


# words users reach for, read as the role they mean
ALIASES = {"probabilities": Role.CLASSIFICATION, "logits": Role.CLASSIFICATION, "scores": Role.CLASSIFICATION,
           "box": Role.BOXES, "keypoints": Role.LANDMARKS, "segmentation": Role.DENSE, "map": Role.DENSE,
           "ctc": Role.SEQUENCE}
DECLARABLE = tuple(r.value for r in Role if r not in (Role.DETECTION, Role.STATE)) + tuple(ALIASES)


@dataclass(frozen=True)
class OutputDeclaration:
    """A role the user declared for one output."""

    output: str  # the output's name as the model has it
    role: Role
    source: str  # "dataset.toml" or "--output-task"
    blank: int | None = None  # a CTC sequence's blank class


@dataclass(frozen=True)
class OutputRole:
    """An output's role and how it was chosen (declared, or inferred: why)."""

    role: Role
    source: str
    blank: int | None = None
    classes_axis: int | None = None  # a dense map's class axis (of one sample's array), when it has one


def parse_role(value: object, *, where: str) -> Role:
    """A role as the user wrote it, or a plain usage error with the nearest known word."""
    from toolkit.model.schemas.problems import did_you_mean

    text = str(value).strip().lower()
    if text in ALIASES:
        return ALIASES[text]
    try:
        role = Role(text)
    except ValueError:
        role = None
    if role is None or role in (Role.DETECTION, Role.STATE):
        near = did_you_mean(text, DECLARABLE)
        raise UsageError(f"Unknown output task {value!r} in {where}{near}.",
                         hint=f"Use one of: {', '.join(DECLARABLE)}.")
    return role


def parse_output_tasks(values: Sequence[str]) -> tuple[OutputDeclaration, ...]:
    """``--output-task NAME=TASK[,blank=N]`` (repeatable) -> declarations."""
    found: list[OutputDeclaration] = []
    for value in values:
        name, sep, rest = str(value).partition("=")
        task, _, extra = rest.partition(",")
        if not sep or not name.strip() or not task.strip():
            raise UsageError(f"--output-task {value!r} is not NAME=TASK.",
                             hint="Write e.g. --output-task landmarks=landmarks or --output-task "
                                  "logits=sequence,blank=0.")
        found.append(OutputDeclaration(name.strip(), parse_role(task, where=f"--output-task {value}"),
                                       "--output-task", _blank(extra, f"--output-task {value}")))
    return tuple(found)


def dataset_outputs(table: Mapping[str, JsonObject] | None) -> tuple[OutputDeclaration, ...]:
    """dataset.toml's ``[outputs.NAME]`` tables (already schema-checked) -> declarations."""
    return tuple(OutputDeclaration(name, parse_role(entry["task"], where=f"dataset.toml [outputs.{name}]"),
                                   "dataset.toml", entry.get("blank"))
                 for name, entry in (table or {}).items())


def _blank(extra: str, where: str) -> int | None:
    key, _, number = extra.partition("=")
    if not extra:
        return None
    if key.strip() != "blank" or not number.strip().isdigit():
        raise UsageError(f"{where}: {extra!r} is not blank=N.", hint="Write e.g. NAME=sequence,blank=0.")
    return int(number)


def check_names(declared: Sequence[OutputDeclaration], names: Sequence[str]) -> None:
    """Refuse a declaration for an output the model does not have, with the nearest name."""
    from toolkit.model.schemas.problems import did_you_mean

    for d in declared:
        if d.output not in names:
            near = did_you_mean(d.output, names)
            raise UsageError(f"{d.source} declares a task for the output {d.output!r}{near}, which the model does "
                             "not have.", hint=f"The model's outputs: {', '.join(names)}.")

