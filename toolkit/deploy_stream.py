"""A push's files as ONE framed stream on one exec channel, for devices where SFTP does not start (Dropbear on
OpenWrt, Buildroot, Yocto: no sftp-server).

Before, such a device got one exec channel per file (``sh -c 'cat > f'``, then ``wc -c``): a channel, a shell
and two commands per file, and, right after the failed SFTP request, channels that Dropbear sometimes answered
by ending the connection. Now the device helper's ``receive`` reads every missing file from its stdin as frames
(a JSON header line ``[rel, offset, length, packed, sha256, size]`` and the bytes; ``[]`` ends the stream),
writes each where the push's ``begin`` prepared it, hashes it as it arrives and refuses a file whose sha256 is
wrong. Resuming is as before: a cut-short file stays on the device, and the next push's ``begin`` reports it as
partial; a compressed file (``--compress``) is inflated as it arrives, so nothing is left to inflate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from toolkit.devices.connection import Progress
from toolkit.types import CommandResult

BLOCK = 1 << 18


class Device(Protocol):
    """What a push needs of ``toolkit.deployment.Device``: the helper's command line and its answer."""

    def helper_argv(self, command: str, *args: str) -> list[str]: ...

    def answer(self, command: str, result: CommandResult) -> dict[str, Any]: ...


class Streams(Protocol):
    """A connection that can run one command with a stream of bytes as its stdin (``SshConnection``)."""

    def sftp_available(self) -> bool: ...

    def stream(self, argv: Sequence[str], blocks: Iterator[bytes], *, total: int, progress: Progress | None = None,
               timeout: float | None = None) -> CommandResult: ...


def streaming(conn: Any) -> Streams | None:
    """The connection, when a push's files should go to it as one stream (it cannot start SFTP); else None."""
    if callable(getattr(conn, "stream", None)) and callable(getattr(conn, "sftp_available", None)):
        return None if conn.sftp_available() else conn
    return None


@dataclass(frozen=True)
class Outgoing:
    """One file of the stream: ``local`` (the bundle file, or its compressed copy when ``packed``) from
    ``offset`` on, ending as ``size`` bytes with ``sha256`` on the device."""

    rel: str
    local: Path
    offset: int
    packed: bool
    sha256: str
    size: int

    @property
    def length(self) -> int:
        return self.local.stat().st_size - (0 if self.packed else self.offset)


def frames(files: Sequence[Outgoing]) -> Iterator[bytes]:
    """The bytes of the stream: a header line and the data of each file, then the end mark."""
    for item in files:
        yield (json.dumps([item.rel, item.offset, item.length, int(item.packed), item.sha256, item.size]) +
               "\n").encode()
        with open(item.local, "rb") as handle:
            if not item.packed:
                handle.seek(item.offset)
            while block := handle.read(BLOCK):
                yield block
    yield b"[]\n"


def send_and_finish(device: Device, conn: Streams, name: str, version: str, token: str, files: Sequence[Outgoing],
                    *, listing: str, keep: int, progress: Progress | None) -> Mapping[str, Any]:
    """Send ``files`` in one stream to the helper's ``receive`` (begin holds the lock ``token``), which then
    finishes the push (``finish``: verify, switch, keep, release the lock) in the same run; ``finish``'s
    answer, or the error the run says (a full disk, a wrong hash, a broken lock)."""
    total = sum(item.length for item in files)
    argv = device.helper_argv("receive", name, version, token, listing, str(keep))
    result = conn.stream(argv, frames(files), total=total, progress=progress)
    return device.answer("receive", result)
