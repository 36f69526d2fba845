"""The one interface deploy and check use to talk to a device, whether it is this machine or an SSH host.

Remote paths are POSIX paths; a relative path is relative to the device user's home directory (SSH sessions
and SFTP both start there; ``local`` runs commands with the home directory as working directory), so the
deploy stage can say ``.edgetk/bundles/<name>`` without knowing where home is.

``run`` takes an argv list, never a shell string: implementations that go through a remote shell quote every
element with :func:`shlex.quote`, so a bundle name or a path with spaces, quotes, ``;``, ``$()`` or backticks
is passed as data and never run.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, runtime_checkable

from toolkit.model.device_records import CommandResult

# progress(bytes_sent_so_far_for_this_file, total_bytes_of_this_file)
Progress = Callable[[int, int], None]


def read_blocks(path: Path, offset: int = 0, size: int = 1 << 18) -> Iterator[bytes]:
    """The bytes of ``path`` from ``offset`` on, in blocks of ``size``."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        while block := handle.read(size):
            yield block


def quote_argv(argv: Sequence[str]) -> str:
    """One shell command line in which every argument is a single literal word."""
    if not argv:
        raise ValueError("empty command")
    return " ".join(shlex.quote(str(a)) for a in argv)


@runtime_checkable
class Connection(Protocol):
    """A device we can run commands on and copy files to. Lazy: nothing connects before the first call."""

    name: str

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        """Run ``argv`` on the device (home directory as cwd) and wait for it; raise DeviceError on timeout."""
        ...

    def put(self, local: Path, remote: str, *, progress: Progress | None = None, offset: int = 0) -> None:
        """Copy a local file to ``remote`` (the parent directory must exist).

        ``offset`` > 0 resumes a cut-short upload: ``remote`` already holds the first ``offset`` bytes, only the
        rest is sent (``progress`` then counts the bytes sent by this call).
        """
        ...

    def get(self, remote: str, local: Path) -> None:
        """Copy ``remote`` to a local file."""
        ...

    def exists(self, remote: str) -> bool:
        """Whether ``remote`` exists on the device."""
        ...

    def close(self) -> None:
        """Release the connection (idempotent)."""
        ...

    def __enter__(self) -> Connection: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
