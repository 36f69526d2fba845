"""A push's files as ONE framed stream on one exec channel, for devices where SFTP does not start (Dropbear on
OpenWrt, Buildroot, Yocto: no sftp-server): not a channel per file, which Dropbear sometimes answers, right
after the failed SFTP request, by ending the connection.

The device helper's ``receive`` reads every missing file from its stdin as frames (a JSON header line
``[rel, offset, length, packed, sha256, size]`` and the bytes; ``[]`` ends the stream), writes each where the
push's ``begin`` prepared it, hashes it as it arrives and refuses a file whose sha256 is wrong. A cut-short
file stays for the next push's ``begin`` to report as partial; a ``--compress`` file is inflated on arrival.

A file of ``SIDE_MIN`` bytes or more, where the helper names a place for it (``side`` in its plan), sends its
second half on a second channel of the same connection at the same time (``frames``' ``split``): Dropbear's
window is per channel, so two packets are in flight instead of one. The helper takes those bytes after the
first half, hashed in order as the rest; a device that refuses the channel gets the file whole on the first,
and a channel that fails on the way is made up for there (``["main"]``). A cut keeps the first half's prefix
for the next push to resume.
"""

from __future__ import annotations

import json
import threading
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


def streaming(conn: Any) -> Streams | None:  # Any: any connection (duck-typed)
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


# a file at least this large sends its second half on a second channel where the connection has one
SIDE_MIN = 4 << 20
# the second channel's receiver (Python >= 3.6, as the helper): its stdin pipe widened as the helper's (``cat``'s
# 64 KiB pipe made Dropbear wait on it and that channel the slower), the bytes written to argv[1], their count said
SIDE_PROGRAM = ("import fcntl, os, shutil, sys\n"
                "try:\n    fcntl.fcntl(0, 1031, 1 << 20)\nexcept OSError:\n    pass\n"  # 1031: F_SETPIPE_SZ
                "with open(sys.argv[1], 'wb') as out:\n    shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)\n"
                "print(os.path.getsize(sys.argv[1]))\n")
Split = Callable[[Outgoing, int, Callable[[Iterable[bytes]], Iterable[bytes]]],
                 "tuple[int, Callable[[], bool]] | None"]


def frames(files: Sequence[Outgoing], split: Split | None = None,
           count: Callable[[Iterable[bytes]], Iterable[bytes]] = lambda blocks: blocks) -> Iterator[bytes]:
    """The bytes of the stream: a header line and the data of each file, then the end mark. ``split(item, index,
    count)``, where given, may start sending the end of a file on a second channel: it gives how many bytes go
    there and the wait for them (True: they arrived whole); the header then says so (its 7th number) and, after
    the file's first part, ``["side"]`` tells the device to take them, or ``["main"]`` that they follow here
    after all (the second channel failed on the way). ``count`` wraps each part's blocks (progress)."""
    for index, item in enumerate(files):
        start = 0 if item.packed else item.offset
        side = split(item, index, count) if split is not None and item.length >= SIDE_MIN else None
        aside = 0 if side is None else side[0]
        head = [item.rel, item.offset, item.length, int(item.packed), item.sha256, item.size]
        head += [aside] if side else []
        yield (json.dumps(head) + "\n").encode()
        yield from count(read_range(item.local, start, item.length - aside))
        if side is not None:
            if side[1]():
                yield b'["side"]\n'
            else:
                yield b'["main"]\n'
                yield from count(read_range(item.local, start + item.length - aside, aside))
    yield b"[]\n"


def read_range(path: Path, offset: int, length: int) -> Iterator[bytes]:
    """``length`` bytes of ``path`` from ``offset`` on, in blocks of ``BLOCK``."""
    left = length
    for block in read_blocks(path, offset, BLOCK):
        yield block[:left]
        left -= len(block)
        if left <= 0:
            return


class Tally:
    """``progress(sent, total)`` over the blocks of several iterators, some sent by another thread."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.progress, self.sent, self.lock = total, progress, 0, threading.Lock()

    def count(self, blocks: Iterable[bytes]) -> Iterator[bytes]:
        for block in blocks:
            yield block
            with self.lock:
                self.sent += len(block)
                if self.progress is not None:
                    self.progress(min(self.sent, self.total), self.total)


class StreamedPush:
    """A whole push on ONE channel and one device-side run (the helper's ``push``): the helper answers
    ``begin``'s plan on stdout (the lock taken, what is missing or cut short), ``plan(answer)`` turns it into the
    files to send (and the progress to show), those go on the same stdin, and the helper receives, hashes and
    finishes them. Against a separate ``begin`` run, that saves a Python start, a channel and a round trip per
    push, most of a small push's fixed cost on a slow device."""

    def __init__(self, device: Device, conn: Streams, args: Callable[[float], list[str]], *, reply_end: str,
                 plan: Callable[[dict[str, Any]], tuple[Sequence[Outgoing], Progress | None]],  # Any: JSON
                 timeout: float) -> None:
        self.device, self.conn, self.args, self.reply_end = device, conn, args, reply_end
        self.plan, self.timeout = plan, timeout
        self.begun: dict[str, Any] | None = None  # Any: JSON
        self.result: CommandResult | None = None
        self.error: DeviceError | None = None

    def begin(self, wait: float) -> dict[str, Any]:  # Any: JSON
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
        tally = Tally(sum(item.length for item in files), progress)
        side_stream = getattr(self.conn, "side_stream", None)
        path = answer.get("side")  # where the device takes a file's second half (a helper that can)
        split = None if not (callable(side_stream) and isinstance(path, str)) else \
            lambda item, index, count: self._split(side_stream, self.device.helper_python, f"{path}.{index}", item,
                                                   count)
        return frames(files, split, tally.count)

    @staticmethod
    def _split(side_stream: Callable[..., Callable[[], CommandResult | None] | None], python: str, path: str,
               item: Outgoing, count: Callable[[Iterable[bytes]], Iterable[bytes]]
               ) -> tuple[int, Callable[[], bool]] | None:
        """Start sending the second half of ``item`` into the device's ``path`` on a second channel: its length
        and the wait for it, or None when the device refuses the channel (the file goes whole on the first)."""
        aside = item.length // 2
        start = (0 if item.packed else item.offset) + item.length - aside
        wait = side_stream([python, "-S", "-c", SIDE_PROGRAM, path], count(read_range(item.local, start, aside)))
        if wait is None:
            return None

        def arrived() -> bool:
            result = wait()
            return result is not None and result.returncode == 0 and result.stdout.split()[-1:] == [str(aside)]

        return aside, arrived

    def finished(self) -> Mapping[str, Any]:  # Any: JSON
        """``finish``'s answer, or the error the receiving part said (a full disk, a wrong hash, a broken lock)."""
        if self.error is not None:
            raise self.error
        assert self.result is not None, "begin first"
        return self.device.answer("receive", self.result)
