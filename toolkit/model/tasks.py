"""What the model does, which decides the metrics: from ``--task``, dataset.toml, or the float outputs' shapes.

Inference looks at one sample's float outputs (shapes, and value ranges where shapes are ambiguous) and is
written to the manifest with the reason, so a wrong guess is visible and ``--task`` fixes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from toolkit.errors import UsageError
from toolkit.model.roles import OutputDeclaration, OutputRole, Role

if TYPE_CHECKING:  # pragma: no cover - the vocabulary is imported by the CLI's option table, numpy is not
    import numpy as np


class Task(StrEnum):
    CLASSIFICATION = "classification"
    DETECTION = "detection"
    SEGMENTATION = "segmentation"
    EMBEDDING = "embedding"
    REGRESSION = "regression"
    RECURRENT = "recurrent"  # a step model whose state outputs feed its state inputs
    SEQUENCE = "sequence"  # one [T, C] output of per-step classes (a CTC recognizer)
    PER_OUTPUT = "per-output"  # several outputs, each judged by its own role (toolkit.model.roles)
    GENERIC = "generic"  # unknown: error, cosine and per-slice metrics only


@dataclass(frozen=True)
class TaskChoice:
    task: Task | None  # None: inferred from the float outputs (only ``outputs`` declared)
    source: str  # "--task", "dataset.toml" or "inferred: <why>"
    outputs: tuple[OutputDeclaration, ...] = ()  # roles declared per output (dataset.toml, --output-task)


def parse_task(value: str | Task | None, *, where: str = "--task") -> Task | None:
    """A task name as the user wrote it, or a plain usage error listing the known ones."""
    if value is None or isinstance(value, Task):
        return value
    try:
        return Task(str(value).strip().lower())
    except ValueError:
        raise UsageError(f"Unknown task {value!r} in {where}.",
                         hint=f"Use one of: {', '.join(t.value for t in Task)}.") from None


def choose_task(flag: str | None, dataset: str | None,
                outputs: Sequence[OutputDeclaration] = ()) -> TaskChoice | None:
    """The task the user named: ``--task`` first, else the eval (or calibration) data's dataset.toml, with the
    roles declared per output (``--output-task`` over dataset.toml's ``[outputs.NAME]``); None when nothing
    is declared (then all is inferred from the float outputs)."""
    for value, where in ((flag, "--task"), (dataset, "dataset.toml")):
        task = parse_task(value, where=where)
        if task is not None:
            return TaskChoice(task, where, tuple(outputs))
    return TaskChoice(None, "", tuple(outputs)) if outputs else None


def infer_task(stacked: Sequence[np.ndarray], names: Sequence[str] = (),
               roles: Sequence[OutputRole] = ()) -> TaskChoice:
    """The task the float outputs look like (``stacked[k]``: output k of every sample, ``[samples, ...]``):
    a detector when boxes and scores decode, else the one output's role, else each output by its own
    (``roles``: from :func:`toolkit.model.roles.assign`)."""
    from toolkit.verification import detection

    if not stacked:
        return TaskChoice(Task.GENERIC, "inferred: the model has no outputs")
    yolo = detection.yolo_layout(stacked[0])
    if len(stacked) == 1 and yolo is not None:
        return TaskChoice(Task.DETECTION, f"inferred: one [4+C, N] head (channel axis {yolo}) with box-sized "
                                          "coordinates in channels 0-3 and scores in [0, 1] after them")
    ssd = detection.ssd_layout(stacked, names)
    if ssd is not None:
        return TaskChoice(Task.DETECTION, f"inferred: separate box ({_name(names, ssd.boxes)}) and score "
                                          f"({_name(names, ssd.scores)}) outputs over the same {ssd.anchors} anchors")
    if len(stacked) > 1 or not roles:
        return TaskChoice(Task.PER_OUTPUT, f"inferred: {len(stacked)} outputs, each judged by its own role")
    shape = stacked[0].shape[1:]
    role = roles[0]
    if role.role is Role.DENSE and role.classes_axis is not None:
        return TaskChoice(Task.SEGMENTATION, f"inferred: a dense map {list(shape)} (classes x height x width)")
    if role.role is Role.SEQUENCE:
        return TaskChoice(Task.SEQUENCE, role.source)
    if role.role in (Role.DENSE, Role.BOXES, Role.LANDMARKS):
        return TaskChoice(Task.PER_OUTPUT, f"inferred: its one output is {role.role.value} ({role.source})")
    squeezed = [d for d in shape if d != 1]
    if len(squeezed) == 1 and squeezed[0] > 1 and len(shape) <= 2:
        return TaskChoice(Task.CLASSIFICATION, f"inferred: one vector of {squeezed[0]} values per sample")
    if len(squeezed) >= 2 and shape[-1] >= 16:
        return TaskChoice(Task.EMBEDDING, f"inferred: vectors of {shape[-1]} values {list(shape)}")
    if not squeezed:
        return TaskChoice(Task.REGRESSION, "inferred: one value per sample")
    return TaskChoice(Task.GENERIC, f"inferred: no known task has outputs shaped {list(shape)}")


def _name(names: Sequence[str], index: int) -> str:
    return names[index] if index < len(names) else f"output_{index}"
