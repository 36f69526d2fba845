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
from toolkit.model.heads import HeadSpec, parse_head
from toolkit.model.records import JsonObject


class Role(StrEnum):
    CLASSIFICATION = "classification"  # probabilities or logits over classes: top-1 / top-k agreement
    BOXES = "boxes"  # box coordinates or offsets: error against their range, IoU where they decode
    LANDMARKS = "landmarks"  # keypoint coordinates: error against their spread over the eval set
    DENSE = "dense"  # a map over positions: argmax agreement / IoU with a class axis, else relative error
    SEQUENCE = "sequence"  # [T, C] per-step classes: per-step agreement, greedy CTC strings with a blank
    EMBEDDING = "embedding"  # a vector compared by direction: cosine
    REGRESSION = "regression"  # plain values: relative error; a vector: each component against its spread
    ORDINAL = "ordinal"  # ordered bins (pitch, angle, age): the value decoded around the peak, error in bins
    DETECTION = "detection"  # a detector's boxes or scores, judged together by the detection metrics
    DETECTION_HEAD = "detection-head"  # a raw head [N, 4+1+C] / [N, 4+C] / [4+C, N]: decoded, NMS, vs float's
    STATE = "state"  # a recurrent model's state, judged over the sequence with the state fed back


# words users reach for, read as the role they mean
ALIASES = {"probabilities": Role.CLASSIFICATION, "logits": Role.CLASSIFICATION, "scores": Role.CLASSIFICATION,
           "box": Role.BOXES, "keypoints": Role.LANDMARKS, "segmentation": Role.DENSE, "map": Role.DENSE,
           "ctc": Role.SEQUENCE, "histogram": Role.ORDINAL, "bins": Role.ORDINAL}
DECLARABLE = tuple(r.value for r in Role if r not in (Role.DETECTION, Role.STATE)) + tuple(ALIASES)


@dataclass(frozen=True)
class OutputDeclaration:
    """A role the user declared for one output."""

    output: str  # the output's name as the model has it
    role: Role
    source: str  # "dataset.toml" or "--output-task"
    blank: int | None = None  # a CTC sequence's blank class
    bin_size: float | None = None  # an ordinal output's bin width in its own unit (20 for 20-cent pitch bins)
    unit: str | None = None  # that unit's name ("cents")
    head: HeadSpec | None = None  # a raw detector head's declared layout and box encoding


@dataclass(frozen=True)
class OutputRole:
    """An output's role and how it was chosen (declared, or inferred: why)."""

    role: Role
    source: str
    blank: int | None = None
    classes_axis: int | None = None  # a dense map's class axis (of one sample's array), when it has one
    bin_size: float | None = None  # ordinal: the bin's width in its unit
    unit: str | None = None
    head: HeadSpec | None = None  # detection-head: the layout declared or inferred (None: infer it)


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
    """``--output-task NAME=TASK[,blank=N]`` (``,bin=W,unit=U``; ``,layout=L,boxes=B``) (repeatable) ->
    declarations."""
    found: list[OutputDeclaration] = []
    for value in values:
        name, sep, rest = str(value).partition("=")
        task, _, extra = rest.partition(",")
        if not sep or not name.strip() or not task.strip():
            raise UsageError(f"--output-task {value!r} is not NAME=TASK.",
                             hint="Write e.g. --output-task landmarks=landmarks or --output-task "
                                  "logits=sequence,blank=0.")
        where = f"--output-task {value}"
        options = _options(extra, where)
        blank = options.get("blank")
        size = options.get("bin")
        role = parse_role(task, where=where)
        head = parse_head(options, where) if role is Role.DETECTION_HEAD else None
        if head is None and ("layout" in options or "boxes" in options):
            raise UsageError(f"{where}: layout= and boxes= describe a raw detector head.",
                             hint=f"Write {name.strip()}=detection-head,layout=n_5c (or drop them).")
        found.append(OutputDeclaration(name.strip(), role, "--output-task",
                                       None if blank is None else _whole(blank, where),
                                       None if size is None else _positive(size, where), options.get("unit"), head))
    return tuple(found)


def _options(extra: str, where: str) -> dict[str, str]:
    """``blank=0`` / ``bin=20,unit=cents`` / ``layout=n_5c,boxes=grid`` after the role."""
    found: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in extra.split(","))):
        key, sep, text = part.partition("=")
        if not sep or key.strip() not in ("blank", "bin", "unit", "layout", "boxes") or not text.strip():
            raise UsageError(f"{where}: {part!r} is not blank=N, bin=WIDTH, unit=NAME, layout=L or boxes=B.",
                             hint="Write e.g. NAME=sequence,blank=0, NAME=ordinal,bin=20,unit=cents or "
                                  "NAME=detection-head,layout=n_5c,boxes=grid.")
        found[key.strip()] = text.strip()
    return found


def _whole(text: str, where: str) -> int:
    if not text.isdigit():
        raise UsageError(f"{where}: blank={text!r} is not a class index.", hint="Write e.g. NAME=sequence,blank=0.")
    return int(text)


def _positive(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"{where}: bin={text!r} is not a positive width.", hint="Write e.g. NAME=ordinal,bin=20.")
    return value


def dataset_outputs(table: Mapping[str, JsonObject] | None) -> tuple[OutputDeclaration, ...]:
    """dataset.toml's ``[outputs.NAME]`` tables (already schema-checked) -> declarations."""
    return tuple(OutputDeclaration(name, parse_role(entry["task"], where=f"dataset.toml [outputs.{name}]"),
                                   "dataset.toml", entry.get("blank"))
                 for name, entry in (table or {}).items())


def check_names(declared: Sequence[OutputDeclaration], names: Sequence[str]) -> None:
    """Refuse a declaration for an output the model does not have, with the nearest name."""
    from toolkit.model.schemas.problems import did_you_mean

    for d in declared:
        if d.output not in names:
            near = did_you_mean(d.output, names)
            raise UsageError(f"{d.source} declares a task for the output {d.output!r}{near}, which the model does "
                             "not have.", hint=f"The model's outputs: {', '.join(names)}.")

