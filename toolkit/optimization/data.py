"""Training and evaluation data for the fine-tune loops: the calibration ``.npz`` layout plus labels.

Inputs live under the model's input names (or ``x`` for a single-input model), labels under ``y``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.errors import UsageError


@dataclass(frozen=True)
class LabelledData:
    """Model inputs in the model's input order, and integer class labels (``None`` when the file has none)."""

    inputs: tuple[np.ndarray, ...]
    labels: np.ndarray | None
    path: Path

    def __len__(self) -> int:
        return int(self.inputs[0].shape[0])

    def first(self, count: int = 1) -> tuple[np.ndarray, ...]:
        """The first ``count`` samples of every input (a batch to trace or time a model with)."""
        return tuple(array[:count] for array in self.inputs)


def load_npz(path: Path | str | os.PathLike[str], *, input_names: Sequence[str], purpose: str,
             need_labels: bool = False) -> LabelledData:
    """Read ``path`` and pick the arrays for ``input_names``; every failure names the file and the fix."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"The {purpose} file {str(path)!r} does not exist.",
                         hint="Pass an .npz file with the inputs under their names (or 'x') and labels under 'y'.")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as exc:
        raise UsageError(f"The {purpose} file {str(path)!r} is not a readable .npz file ({exc}).",
                         hint="Write it with numpy.savez(path, x=inputs, y=labels).") from exc
    candidates = {k: v for k, v in arrays.items() if k != "y"}
    names = list(input_names)
    if all(name in candidates for name in names):
        inputs = tuple(candidates[name] for name in names)
    elif len(names) == 1 and "x" in candidates:
        inputs = (candidates["x"],)
    elif len(names) == 1 and len(candidates) == 1:
        inputs = (next(iter(candidates.values())),)
    else:
        raise UsageError(
            f"The {purpose} file {str(path)!r} holds {sorted(arrays)}, but the model's inputs are {names}.",
            hint="Store each input under its name (or under 'x' for a single-input model) and labels under 'y'.",
        )
    labels = arrays.get("y")
    if need_labels and labels is None:
        raise UsageError(f"The {purpose} file {str(path)!r} has no labels under 'y'.",
                         hint="Add the integer class labels: numpy.savez(path, x=inputs, y=labels).")
    count = inputs[0].shape[0]
    if any(a.shape[0] != count for a in inputs) or (labels is not None and labels.shape[0] != count):
        raise UsageError(f"The arrays in the {purpose} file {str(path)!r} hold different numbers of samples.",
                         hint="Every input and 'y' need the same first dimension.")
    if count == 0:
        raise UsageError(f"The {purpose} file {str(path)!r} holds no samples.")
    return LabelledData(
        inputs=tuple(np.asarray(a, dtype=np.float32) for a in inputs),
        labels=None if labels is None else np.asarray(labels).astype(np.int64).reshape(-1),
        path=path,
    )
