"""A push's files as ONE framed stream on one exec channel, for devices where SFTP does not start (Dropbear on
OpenWrt, Buildroot, Yocto: no sftp-server): not a channel per file, which Dropbear sometimes answers, right
after the failed SFTP request, by ending the connection.

The device helper's ``receive`` reads every missing file from its stdin as frames (a JSON header line
``[rel, offset, length, packed, sha256, size]`` and the bytes; ``[]`` ends the stream), writes each where the
push's ``begin`` prepared it, hashes it as it arrives and refuses a file whose sha256 is wrong. A cut-short
file stays for the next push's ``begin`` to report as partial; a ``--compress`` file is inflated on arrival.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from toolkit.delivery.deployment import Device, refusal
from toolkit.devices.connection import Progress, read_blocks
from toolkit.errors import DeviceError, LinkDropped
from toolkit.model.device_records import CommandResult
from toolkit.model.vocabulary import HelperRefusal

BLOCK = 1 << 18


class Streams(Protocol):
    """A connection that can run one command with a stream of bytes as its stdin (``SshConnection``)."""

    def sftp_available(self) -> bool: ...

    def stream(self, argv: Sequence[str], blocks: Iterable[bytes] | Callable[[str], Iterable[bytes] | None], *,
               total: int, progress: Progress | None = None, timeout: float | None = None,
               reply_end: str = "") -> CommandResult: ...


def streaming(conn: Any, *, total: int = 0) -> tuple[Streams | None, str]:  # Any: any connection (duck-typed)
    """Where a push of ``total`` bytes streams its files: (the system ``ssh`` client, when the bundle is large and
    the device can be reached by it: :mod:`toolkit.devices.ssh_client`; else the connection itself when it
    cannot start SFTP; else None: file by file) and how, in words (for the push's report)."""
    why_not = None
    ssh = sys.modules.get("toolkit.devices.ssh")  # not loaded: no SSH connection exists (and paramiko stays out)
    if ssh is not None and isinstance(conn, ssh.SshConnection):
        from toolkit.devices.ssh_client import client_streams

        route, why_not = client_streams(conn, total=total)
        if route is not None:
            return route, route.route
    if callable(getattr(conn, "stream", None)) and callable(getattr(conn, "sftp_available", None)):
        if not conn.sftp_available():
            return conn, "paramiko exec stream" + (f" ({why_not})" if why_not else "")
        return None, "paramiko SFTP" + (f" ({why_not})" if why_not else "")
    return None, "files"


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
        yield from read_blocks(item.local, 0 if item.packed else item.offset, BLOCK)
    yield b"[]\n"


def counted(blocks: Iterable[bytes], total: int, progress: Progress | None) -> Iterator[bytes]:
    """``blocks``, calling ``progress(sent, total)`` after each."""
    sent = 0
    for block in blocks:
        yield block
        sent += len(block)
        if progress is not None:
            progress(sent, total)


class StreamedPush:
    """A whole push on ONE channel and one device-side run (the helper's ``push``): the helper answers
    ``begin``'s plan on stdout (the lock taken, what is missing or cut short), ``plan(answer)`` turns it into the
    files to send (and the progress to show), those go on the same stdin, and the helper receives, hashes and
    finishes them. Against a separate ``begin`` run, that saves a Python start, a channel and a round trip per
    push, most of a small push's fixed cost on a slow device."""

    def __init__(self, device: Device, conn: Streams, args: Callable[[float], list[str]], *, reply_end: str,
                 plan: Callable[[dict[str, object]], tuple[Sequence[Outgoing], Progress | None]],
                 timeout: float) -> None:
        self.device, self.conn, self.args, self.reply_end = device, conn, args, reply_end
        self.plan, self.timeout = plan, timeout
        self.begun: dict[str, object] | None = None
        self.result: CommandResult | None = None
        self.error: DeviceError | None = None

    def begin(self, wait: float) -> dict[str, object]:
        """Run the push, waiting up to ``wait`` s on the device for the lock: begin's plan, or its refusal
        raised. What the rest of the run said is read with ``finished``."""
        for attempt in (1, 2):
            self.begun = None
            try:
                result = self.conn.stream(self.device.helper_argv("push", *self.args(wait)), self._send, total=0,
                                          timeout=wait + self.timeout, reply_end=self.reply_end)
            except LinkDropped:
                raise  # no clean-up can get through
            except DeviceError as exc:
                if self.begun is None:
                    raise
                self.error = exc  # the lock is taken: the push's caller cleans up, as after a refused file
                return self.begun
            if self.begun is not None:
                self.result = result
                return self.begun
            if attempt == 1 and refusal(result) is HelperRefusal.HELPER_MISSING:
                self.device.install_helper()  # once per device and helper version
                continue
            return self.device.answer("begin", result)  # raises the refusal (a held lock, a foreign arch)
        raise AssertionError("unreachable")

    def _send(self, head: str) -> Iterable[bytes] | None:
        answer = self.device.answer("begin", CommandResult(0, head, ""))
        if "error" in answer and "kind" in answer:
            return None  # refused: the run ends with that answer
        self.begun = answer
        files, progress = self.plan(answer)
        return counted(frames(files), sum(item.length for item in files), progress)

    def finished(self) -> Mapping[str, object]:
        """``finish``'s answer, or the error the receiving part said (a full disk, a wrong hash, a broken lock)."""
        if self.error is not None:
            raise self.error
        assert self.result is not None, "begin first"
        return self.device.answer("receive", self.result)
