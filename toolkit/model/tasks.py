"""What the model does, which decides the metrics: the vocabulary and the user's choice (``--task``,
dataset.toml). Inference from the float outputs is :func:`toolkit.verification.inference.infer_task`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from toolkit.errors import UsageError
from toolkit.model.roles import OutputDeclaration


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
