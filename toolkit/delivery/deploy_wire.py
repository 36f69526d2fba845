"""Which bytes of a bundle a push sends: gzip copies where they pay (``--compress``), where a cut-short upload
resumes (its bytes on the device are a prefix of ours), and their progress on stderr."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from toolkit.delivery.bundle import Bundle
from toolkit.devices.connection import Progress

COMPRESS_LEVEL = 6  # zlib level: most of level 9's ratio on model files at a fraction of its CPU time
COMPRESS_MIN_SAVING = 0.10  # send compressed only when that saves at least 10% of the file
COMPRESS_MIN_BYTES = 4096  # smaller files: not worth a round of inflate


def compress_files(bundle: Bundle, rels: list[str], folder: Path) -> dict[str, Path]:
    """gzip each file (level ``COMPRESS_LEVEL``) into ``folder``; keep those where it saves enough."""
    import zlib

    packed: dict[str, Path] = {}
    for index, rel in enumerate(rels):
        source = bundle.path / rel
        size = source.stat().st_size
        if size < COMPRESS_MIN_BYTES:
            continue
        target = folder / f"{index}.gz"
        compressor = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31)  # 31: gzip container
        with open(source, "rb") as src, open(target, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(compressor.compress(block))
            dst.write(compressor.flush())
        if target.stat().st_size <= size * (1.0 - COMPRESS_MIN_SAVING):
            packed[rel] = target
        else:
            target.unlink()
    return packed


def resume_offsets(bundle: Bundle, partial: dict[str, Any], sizes: dict[str, int]) -> dict[str, int]:  # Any: JSON
    """For each cut-short file on the device: resume at its size when its bytes prefix ours (Any: JSON)."""
    import hashlib

    offsets: dict[str, int] = {}
    for rel, entry in partial.items():
        try:
            have, digest = int(entry[0]), str(entry[1])
        except (TypeError, ValueError, IndexError):
            continue
        if rel not in sizes or not 0 < have < sizes[rel]:
            continue
        prefix = hashlib.sha256()
        with open(bundle.path / rel, "rb") as handle:
            left = have
            while left > 0:
                block = handle.read(min(left, 1 << 20))
                if not block:
                    break
                prefix.update(block)
                left -= len(block)
        if prefix.hexdigest() == digest:
            offsets[rel] = have
    return offsets


class UploadProgress:
    """Bytes sent and rate, on stderr, at most twice a second per device (threads write whole lines).

    A connection takes the first megabytes at once into its buffers (the SSH window, the socket), so the bytes
    handed over in the first interval say nothing about the link: the first line gives no rate, and every later
    one the rate since that first line (while the buffers stay full, what goes in is what went out). The last
    line (``sent``) is the whole push over its whole time: everything has arrived then."""

    _lock = threading.Lock()

    def __init__(self, device: str, total: int, *, stream: TextIO | None = None, interval: float = 0.5) -> None:
        self.device = device
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.done = 0
        self.started = time.perf_counter()
        self._last = self.started
        self._first: tuple[float, int] | None = None  # (time, bytes) at the first line: the buffers filled

    def file_progress(self, base: int) -> Progress:
        """The progress callback of one file whose first byte is the push's ``base``-th."""
        def callback(sent: int, _total: int) -> None:
            self.done = base + sent
            now = time.perf_counter()
            if now - self._last >= self.interval:
                self._last = now
                self._line("uploading")

        return callback

    def rate(self, *, final: bool = False) -> float | None:
        """MB/s: over the whole push when ``final``, else since the first line (None on the first line)."""
        now = time.perf_counter()
        if final:
            return self.done / 1e6 / max(now - self.started, 1e-6)
        if self._first is None:
            self._first = (now, self.done)
            return None
        since, at = self._first
        return (self.done - at) / 1e6 / max(now - since, 1e-6)

    def _line(self, what: str) -> None:
        rate = self.rate(final=what == "sent")
        with self._lock:
            print(
                f"{self.device}: {what} {self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB"
                + (f" ({rate:.1f} MB/s)" if rate is not None else ""),
                file=self.stream,
                flush=True,
            )

    def finish(self) -> None:
        if self.total:
            self._line("sent")
