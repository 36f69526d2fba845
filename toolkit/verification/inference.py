"""Each output's role and the model's task, inferred from the float outputs over the eval set.

Inference reads one output's float values (shape without the batch axis, value range, whether each row is a
distribution) and, where it is telling, its name; the model's task follows from its outputs' layouts and
roles. The reason is recorded beside each, so a wrong guess is visible and ``--task`` / ``--output-task`` fix
it. The vocabulary (:class:`~toolkit.model.roles.Role`, :class:`~toolkit.model.tasks.Task`) is in model/.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from toolkit.model.heads import HeadLayout, HeadSpec
from toolkit.model.roles import OutputDeclaration, OutputRole, Role
from toolkit.model.tasks import Task, TaskChoice
from toolkit.verification import detection, detection_head, ordinal
from toolkit.verification.detection import MAX_BOX_VALUES
from toolkit.verification.segmentation import class_axis

NAME_HINTS: tuple[tuple[tuple[str, ...], Role], ...] = (
    (("landmark", "keypoint", "kpt", "joint"), Role.LANDMARKS),
    (("bbox", "box", "regress"), Role.BOXES),
    (("ctc", "sequence", "seq", "char", "text"), Role.SEQUENCE),
    (("embed", "feature", "descriptor"), Role.EMBEDDING),
    (("prob", "score", "logit", "class", "softmax", "conf"), Role.CLASSIFICATION),
)

EMBEDDING_SIZE = 64  # an unbounded vector at least this long, beside other outputs, is an embedding
BLANK_SHARE = 0.4  # a class that is the argmax at this share of all steps, at either end, is a CTC blank


def output_name(names: Sequence[str], k: int) -> str:
    """Output ``k``'s name, or ``output_k`` where the model gives none."""
    return names[k] if k < len(names) and names[k] else f"output_{k}"


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
    return _probabilities(values) and values.shape[-1] > 1 and bool(
        np.allclose(values.sum(axis=-1), 1.0, atol=2e-2))


def evident_blank(values: np.ndarray) -> int | None:
    """The CTC blank of ``[samples, T, C]``: the first or last class when it is the argmax at a large share
    of all steps (a recognizer emits blank between and around its characters); else None."""
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
        ordered = ordinal.evidence(core.reshape(len(core), -1))
        if ordered is not None:
            return OutputRole(Role.ORDINAL, f"inferred: {ordered}")
        if alone and not probs and named in (None, Role.CLASSIFICATION):  # "scores" may be regression scores
            scores = regression_evidence(core.reshape(len(core), -1), correlated_only=named is not None)
            if scores is not None:
                return OutputRole(Role.REGRESSION, f"inferred: {scores}")
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
    head = detection_head.infer(stacked) if len(shape) == 2 else None
    if head is not None:
        return head_role(head, "inferred")
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


MAX_SCORES = 8  # a single output's vector of at most this many unbounded values may be regression scores
SCORE_CORRELATION = 0.5  # components that rise and fall together (mean pairwise correlation) are scores
SCORE_DOMINANCE = 0.9  # or one component is the largest in this share of the samples


def regression_evidence(rows: np.ndarray, *, correlated_only: bool = False) -> str | None:
    """Why ``[samples, n]`` unbounded values look like regression scores rather than a classifier's logits:
    logits of different classes move against each other and their argmax varies with the input; scores (a
    speech-quality model's SIG, BAK, OVRL) move together, or one of them stays on top (not for an output named
    like class scores: ``correlated_only``). None otherwise."""
    n = rows.shape[-1]
    if n < 2 or n > MAX_SCORES or rows.shape[0] < 5:
        return None
    spread = rows.std(axis=0)
    dominance = float(np.max(np.bincount(np.argmax(rows, axis=-1), minlength=n))) / rows.shape[0]
    correlation = None
    if np.all(spread > 0):
        c = np.corrcoef(rows.T)
        correlation = float((c.sum() - n) / (n * (n - 1)))
    if correlation is not None and correlation >= SCORE_CORRELATION:
        why = f"its components move together (mean correlation {correlation:.2f})"
    elif dominance >= SCORE_DOMINANCE and not correlated_only:
        why = f"one component is the largest in {dominance:.0%} of the samples"
    else:
        return None
    return (f"{n} unbounded values per sample (no softmax) and {why}: regression scores, each judged against "
            "its own spread, never by argmax")


def head_role(head: detection_head.Head, how: str) -> OutputRole:
    """The detection-head role of an output read as ``head``, its evidence in the source."""
    return OutputRole(Role.DETECTION_HEAD, f"{how}: {head.evidence}", head=HeadSpec(head.layout, head.boxes))


def objectness(role: OutputRole) -> bool:
    """Whether ``role`` is a raw head whose column 4 is objectness (then it is no YOLOv8-style head)."""
    return role.role is Role.DETECTION_HEAD and role.head is not None and role.head.layout is HeadLayout.N_5C


def alternatives(role: OutputRole, stacked: np.ndarray) -> tuple[OutputRole, ...]:
    """The roles an inferred output might carry instead (tried when it fails its inferred role): ordinal or
    regression for a vector, a raw detector head for a matrix that decodes as one."""
    core = core_view(stacked)
    if not role.source.startswith("inferred") or role.role is Role.DETECTION_HEAD:
        return ()
    if core.ndim == 3:
        head = detection_head.infer(stacked, loose=True)
        return (head_role(head, "alternative"),) if head is not None else ()
    if core.ndim != 2:
        return ()
    found = []
    if role.role is not Role.ORDINAL and core.shape[-1] >= ordinal.MIN_BINS and core.min() >= -1e-3:
        found.append(OutputRole(Role.ORDINAL, "alternative"))
    if role.role is not Role.REGRESSION and core.shape[-1] <= MAX_SCORES:
        found.append(OutputRole(Role.REGRESSION, "alternative"))
    return tuple(found)


def assign(stacked: Sequence[np.ndarray], names: Sequence[str], declared: Sequence[OutputDeclaration] = (),
           *, decoded: Collection[int] = (), state: Sequence[int] = ()) -> list[OutputRole]:
    """Every output's role: declared first, then a detector's ``decoded`` outputs (their indices) and a step
    model's state, then inferred from the float values."""
    by_name = {d.output: d for d in declared}
    roles: list[OutputRole] = []
    for k, ref in enumerate(stacked):
        name = output_name(names, k)
        d = by_name.get(name)
        if d is not None:
            blank = d.blank
            if d.role is Role.SEQUENCE and blank is None:
                blank = evident_blank(core_view(ref)) if core_view(ref).ndim == 3 else None
            axis = None
            if d.role is Role.DENSE:
                axis = class_axis(ref.shape[1:])
            roles.append(OutputRole(d.role, d.source, blank, axis, d.bin_size, d.unit, d.head))
        elif k in decoded:
            roles.append(OutputRole(Role.DETECTION, "inferred: decoded with the other detector output"))
        elif k in state:
            roles.append(OutputRole(Role.STATE, "inferred: fed back to a state input"))
        else:
            roles.append(infer_role(ref, name, alone=len(stacked) == 1))
    return roles


def infer_task(stacked: Sequence[np.ndarray], names: Sequence[str] = (),
               roles: Sequence[OutputRole] = ()) -> TaskChoice:
    """The task the float outputs look like (``stacked[k]``: output k of every sample, ``[samples, ...]``):
    a detector when boxes and scores decode, else the one output's role, else each output by its own
    (``roles``: from :func:`assign`)."""
    if not stacked:
        return TaskChoice(Task.GENERIC, "inferred: the model has no outputs")
    heads = [k for k, r in enumerate(roles) if r.role is Role.DETECTION_HEAD]
    raw = f"inferred: {output_name(names, heads[0])} is a raw detector head (its role_source says why)" if heads else ""
    if any(objectness(roles[k]) for k in heads):  # YOLOv5's [N, 85]: column 4 is no class, whatever its boxes
        return TaskChoice(Task.DETECTION, raw)
    yolo = detection.yolo_layout(stacked[0])
    if len(stacked) == 1 and yolo is not None:
        return TaskChoice(Task.DETECTION, f"inferred: one [4+C, N] head (channel axis {yolo}) with box-sized "
                                          "coordinates in channels 0-3 and scores in [0, 1] after them")
    ssd = detection.ssd_layout(stacked, names)
    if ssd is not None:
        return TaskChoice(Task.DETECTION, f"inferred: separate box ({output_name(names, ssd.boxes)}) and score "
                                          f"({output_name(names, ssd.scores)}) outputs over the same {ssd.anchors} anchors")
    if heads:
        return TaskChoice(Task.DETECTION, raw)
    if len(stacked) > 1 or not roles:
        return TaskChoice(Task.PER_OUTPUT, f"inferred: {len(stacked)} outputs, each judged by its own role")
    shape = stacked[0].shape[1:]
    role = roles[0]
    if role.role is Role.DENSE and role.classes_axis is not None:
        return TaskChoice(Task.SEGMENTATION, f"inferred: a dense map {list(shape)} (classes x height x width)")
    if role.role is Role.SEQUENCE:
        return TaskChoice(Task.SEQUENCE, role.source)
    if role.role in (Role.DENSE, Role.BOXES, Role.LANDMARKS, Role.ORDINAL) or (
            role.role is Role.REGRESSION and int(np.prod(shape)) > 1):
        return TaskChoice(Task.PER_OUTPUT, f"inferred: its one output is {role.role.value} ({role.source})")
    squeezed = [d for d in shape if d != 1]
    if len(squeezed) == 1 and squeezed[0] > 1 and len(shape) <= 2:
        return TaskChoice(Task.CLASSIFICATION, f"inferred: one vector of {squeezed[0]} values per sample")
    if len(squeezed) >= 2 and shape[-1] >= 16:
        return TaskChoice(Task.EMBEDDING, f"inferred: vectors of {shape[-1]} values {list(shape)}")
    if not squeezed:
        return TaskChoice(Task.REGRESSION, "inferred: one value per sample")
    return TaskChoice(Task.GENERIC, f"inferred: no known task has outputs shaped {list(shape)}")
