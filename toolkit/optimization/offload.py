"""Optimizer-state offloading for PyTorch fine-tuning: Adam/AdamW whose state does not sit where memory binds.

Adam keeps two float32 moments per parameter (``exp_avg``, ``exp_avg_sq``): for a 50M-parameter model that is
400 MB, twice the weights. ``OffloadedAdam`` (toolkit.optimization.offloaded_adam; torch at its top, so it is
imported only when asked for) keeps them elsewhere and runs the update where they are:

- ``Offload.CPU`` (ZeRO-Offload): the model sits on an accelerator; the moments and a float32 master copy of
  each parameter live in host memory, and the step runs on the CPU: the gradient is copied down, the master
  updated, the parameter copied back up. The accelerator holds weights, gradients and activations only.
  A model that already trains on the CPU gains nothing (its state is in host memory either way), so the fine-tune
  loop refuses that combination by name.
- ``Offload.DISK`` (ZeRO-Infinity's NVMe offload, for a CPU host where host RAM binds): the moments of every
  parameter live in one unlinked file; each step streams them one parameter at a time into a reusable buffer
  sized for the largest parameter, updates, and writes them back. Resident: that buffer (2 x the largest
  parameter), not 2 x all of them. The file goes through the page cache, which the kernel writes back and
  evicts under memory pressure (anonymous memory would need swap, which these hosts often lack). The file goes
  to ``tempfile.gettempdir()`` (``$TMPDIR``); a folder on a tmpfs (RAM) is refused, since there it would save
  nothing.

The update is torch's own single-tensor Adam (``torch.optim.adam.adam``, ``foreach=False``), called per
parameter: elementwise, so the result is bitwise the one ``torch.optim.Adam`` (foreach off, the CPU default)
gives; tests/optimization/test_offload.py checks that, and that the measured peak memory drops. The optimizer's
``state_dict`` carries no moments (they are in the file or the host store): resuming a run is not offered,
and the saved model never carried optimizer state anyway.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from toolkit.errors import UsageError


class Offload(StrEnum):
    """Where the optimizer state lives while fine-tuning (``--offload-optimizer``)."""

    CPU = "cpu"  # host memory, the step on the CPU, the model on an accelerator
    DISK = "disk"  # a file, streamed one parameter at a time


def parse_offload(value: str | Offload | None) -> Offload | None:
    """``--offload-optimizer``'s value as an :class:`Offload` (None: the state stays with the model)."""
    if value is None or isinstance(value, Offload):
        return value
    try:
        return Offload(str(value).lower())
    except ValueError:
        raise UsageError(f"Unknown optimizer offload {value!r}.",
                         hint=f"Pick one of {', '.join(o.value for o in Offload)}.") from None


@runtime_checkable
class OffloadedOptimizer(Protocol):
    """An optimizer holding offloaded state that should be released when training ends."""

    def close(self) -> None: ...


def _filesystem_type(directory: Path) -> str:
    """The type of the file system ``directory`` is on (the longest mount point above it in /proc/self/mounts),
    "" where that cannot be read."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    best, kind = "", ""
    target = str(directory.resolve())
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def state_directory() -> Path:
    """Where ``Offload.DISK`` writes its state file: ``tempfile.gettempdir()``, refused when it is in RAM."""
    import tempfile

    directory = Path(tempfile.gettempdir())
    kind = _filesystem_type(directory)
    if kind in ("tmpfs", "ramfs"):
        raise UsageError(
            f"--offload-optimizer disk would write the optimizer state to {directory}, which is a {kind} (memory), "
            "so it would save no memory.",
            hint="Set TMPDIR to a folder on a disk (for example TMPDIR=$HOME/.cache) and run again.")
    return directory
