"""Each output's role (what it carries), declared by the user or inferred from its float values, and the
vocabulary of declarations (``[outputs.NAME] task = "..."`` in dataset.toml, ``--output-task NAME=TASK``).

A model's outputs are judged one by one: a face stage's box offsets by their error against their range, its
landmarks against their spread, its face probability by decision agreement; a CTC recognizer's ``[1, T, C]``
by per-step agreement and the decoded strings. Inference reads one output's float values over the eval set
(shape without the batch axis, value range, whether each row is a distribution) and, where it is telling, its
name; the reason is recorded beside the role. The metrics are in :mod:`.role_metrics`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from toolkit.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover - the vocabulary is read by the CLI's option table, numpy is not
    import numpy as np


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
NAME_HINTS: tuple[tuple[tuple[str, ...], Role], ...] = (
    (("landmark", "keypoint", "kpt", "joint"), Role.LANDMARKS),
    (("bbox", "box", "regress"), Role.BOXES),
    (("ctc", "sequence", "seq", "char", "text"), Role.SEQUENCE),
    (("embed", "feature", "descriptor"), Role.EMBEDDING),
    (("prob", "score", "logit", "class", "softmax", "conf"), Role.CLASSIFICATION),
)

MAX_BOX_VALUES = 4 + 2 * 21  # a box per anchor, maybe followed by key points (BlazeFace: 4 + 6 x 2)
EMBEDDING_SIZE = 64  # an unbounded vector at least this long, beside other outputs, is an embedding
BLANK_SHARE = 0.4  # a class that is the argmax at this share of all steps, at either end, is a CTC blank


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


def parse_role(value: Any, *, where: str) -> Role:
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


def dataset_outputs(table: Mapping[str, Mapping[str, Any]] | None) -> tuple[OutputDeclaration, ...]:
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


# --------------------------------------------------------------------------------------------- inference


def core_view(stacked: np.ndarray) -> np.ndarray:
    """``[samples, ...]`` with the batch axis (a leading 1) dropped: it is never a class axis."""
    shape = list(stacked.shape[1:])
    if len(shape) >= 2 and shape[0] == 1:
        shape = shape[1:]
    return stacked.reshape((stacked.shape[0], *shape))


def _probabilities(values: np.ndarray) -> bool:
    return bool(values.size and values.min() >= -1e-3 and values.max() <= 1 + 1e-3)


def _distributions(values: np.ndarray) -> bool:
    """Each row along the last axis sums to 1 (a softmax)."""
    import numpy as np

    return _probabilities(values) and values.shape[-1] > 1 and bool(
        np.allclose(values.sum(axis=-1), 1.0, atol=2e-2))


def evident_blank(values: np.ndarray) -> int | None:
    """The CTC blank of ``[samples, T, C]``: the first or last class when it is the argmax at a large share
    of all steps (a recognizer emits blank between and around its characters); else None."""
    import numpy as np

    top = np.argmax(values, axis=-1).ravel()
    if not top.size:
        return None
    counts = np.bincount(top, minlength=values.shape[-1])
    for blank in (0, values.shape[-1] - 1):
        if counts[blank] >= BLANK_SHARE * top.size and counts[blank] == counts.max():
            return int(blank)
    return None


def _named(name: str) -> Role | None:
    lowered = name.lower()
    for words, role in NAME_HINTS:
        if any(w in lowered for w in words):
            return role
    return None


def infer_role(stacked: np.ndarray, name: str = "", *, alone: bool = True) -> OutputRole:
    """The role of one output from its float values ``[samples, ...]`` (and its name where telling).

    ``alone``: the model's only output (an unbounded vector is then a classifier's logits, as before; beside
    other outputs it is read as coordinates or an embedding, never argmax'd)."""
    from toolkit.verification.segmentation import class_axis

    core = core_view(stacked)
    shape = list(core.shape[1:])
    named = _named(name)
    probs, dist = _probabilities(core), _distributions(core)
    size = int(core[0].size) if core.shape[0] else 0
    if size <= 1:
        if probs:
            return OutputRole(Role.CLASSIFICATION, "inferred: one value in [0, 1] per sample (a probability; "
                                                   "decision at 0.5)")
        return OutputRole(Role.REGRESSION, "inferred: one value per sample")
    if len(shape) == 1:
        n = shape[0]
        if dist or (named is Role.CLASSIFICATION):
            return OutputRole(Role.CLASSIFICATION, f"inferred: {n} {'probabilities summing to 1' if dist else 'scores'}"
                                                   f"{' named ' + repr(name) if named and not dist else ''}")
        if named in (Role.BOXES, Role.LANDMARKS, Role.EMBEDDING):
            return OutputRole(named, f"inferred: {n} values named {name!r}")
        if alone:
            return OutputRole(Role.CLASSIFICATION, f"inferred: one vector of {n} values per sample")
        if n == 4:
            return OutputRole(Role.BOXES, "inferred: 4 values beside other outputs (a box or its offsets)")
        if n >= EMBEDDING_SIZE and not probs:
            return OutputRole(Role.EMBEDDING, f"inferred: an unbounded vector of {n} values")
        if n % 2 == 0 and n >= 6:
            return OutputRole(Role.LANDMARKS, f"inferred: {n} values beside other outputs ({n // 2} x, y points)")
        return OutputRole(Role.REGRESSION, f"inferred: {n} values beside other outputs")
    axis = class_axis(stacked.shape[1:])
    if len(shape) >= 3 or axis is not None:
        if axis is not None:
            return OutputRole(Role.DENSE, f"inferred: a dense map {list(stacked.shape[1:])} with a class axis "
                                          f"({axis})", classes_axis=axis)
        return OutputRole(Role.DENSE, f"inferred: a dense map {list(stacked.shape[1:])}"
                                      f"{' of probabilities' if probs else ''}")
    steps, width = shape
    if dist:
        blank = evident_blank(core)
        return OutputRole(Role.SEQUENCE, f"inferred: {steps} steps of {width} class probabilities summing to 1"
                                         + (f"; class {blank} is the argmax at most steps (a CTC blank)"
                                            if blank is not None else ""), blank=blank)
    if probs:
        return OutputRole(Role.DENSE, f"inferred: a {steps} x {width} map of probabilities (each position on "
                                      "its own; thresholded at 0.5)")
    if (width == 4 or (4 < width <= MAX_BOX_VALUES and width % 2 == 0 and named is Role.BOXES)) and steps >= 16:
        return OutputRole(Role.BOXES, f"inferred: {width} values per each of {steps} anchors")
    if named is Role.LANDMARKS or (width in (2, 3) and steps >= 2 and not alone):
        return OutputRole(Role.LANDMARKS, f"inferred: {steps} points of {width} coordinates")
    blank = evident_blank(core) if named in (Role.SEQUENCE, Role.CLASSIFICATION) else None
    if named is Role.SEQUENCE or blank is not None:  # unbounded steps: only a name says they are class scores
        return OutputRole(Role.SEQUENCE, f"inferred: {steps} steps of {width} class scores named {name!r}"
                                         + (f"; class {blank} is the argmax at most steps (a CTC blank)"
                                            if blank is not None else ""), blank=blank)
    if alone and width >= 16:
        return OutputRole(Role.EMBEDDING, f"inferred: {steps} vectors of {width} unbounded values")
    return OutputRole(Role.DENSE, f"inferred: a {steps} x {width} map of unbounded values")


def assign(stacked: Sequence[np.ndarray], names: Sequence[str], declared: Sequence[OutputDeclaration] = (),
           *, decoded: Collection[int] = (), state: Sequence[int] = ()) -> list[OutputRole]:
    """Every output's role: declared first, then a detector's ``decoded`` outputs (their indices) and a step
    model's state, then inferred from the float values."""
    by_name = {d.output: d for d in declared}
    roles: list[OutputRole] = []
    for k, ref in enumerate(stacked):
        name = names[k] if k < len(names) else f"output_{k}"
        d = by_name.get(name)
        if d is not None:
            blank = d.blank
            if d.role is Role.SEQUENCE and blank is None:
                blank = evident_blank(core_view(ref)) if core_view(ref).ndim == 3 else None
            axis = None
            if d.role is Role.DENSE:
                from toolkit.verification.segmentation import class_axis

                axis = class_axis(ref.shape[1:])
            roles.append(OutputRole(d.role, d.source, blank, axis))
        elif k in decoded:
            roles.append(OutputRole(Role.DETECTION, "inferred: decoded with the other detector output"))
        elif k in state:
            roles.append(OutputRole(Role.STATE, "inferred: fed back to a state input"))
        else:
            roles.append(infer_role(ref, name, alone=len(stacked) == 1))
    return roles
