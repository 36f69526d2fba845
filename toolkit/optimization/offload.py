"""Optimizer-state offloading for PyTorch fine-tuning: Adam/AdamW whose two float32 moments per parameter
(twice the weights) do not sit where memory binds; docs/optimization.md has the design and the figures.

- ``Offload.CPU`` (ZeRO-Offload): the model on an accelerator, the moments and a float32 master copy in host
  memory, the step on the CPU. A model that trains on the CPU gains nothing, so that combination is refused.
- ``Offload.DISK`` (ZeRO-Infinity's NVMe offload, for a CPU host where RAM binds): the moments in one unlinked
  file in ``tempfile.gettempdir()``, streamed one parameter at a time through one buffer sized for the
  largest. The page cache, unlike anonymous memory, is evicted without swap; a tmpfs folder is refused.

The update is torch's own single-tensor Adam (``foreach=False``), per parameter, so the result is bitwise
``torch.optim.Adam``'s (tests/optimization/test_offload.py). ``OffloadedAdam`` lives in ``offloaded_adam``
(torch at its top). Its ``state_dict`` carries no moments: resuming a run is not offered.
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
