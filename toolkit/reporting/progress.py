"""Progress on stderr, one line per step, prefixed with the stage (``[1/3 convert]``), so that the conversion
steps and the upload lines of ``deployment.UploadProgress`` read as one sequence. stdout stays for the result."""

from __future__ import annotations

import sys
import threading
from typing import TextIO

STAGES = ("convert", "deploy", "check")


class StageProgress:
    """``progress(message)`` for the pipeline, and ``stream(stage)`` as a text stream for deploy's uploads."""

    def __init__(self, stream: TextIO | None = None, *, stages: tuple[str, ...] = STAGES) -> None:
        self.out = stream if stream is not None else sys.stderr
        self.stages = stages
        self.stage = stages[0]
        self.lock = threading.Lock()  # one line at a time, from every stage's stream

    def prefix(self, stage: str | None = None) -> str:
        stage = stage or self.stage
        index = self.stages.index(stage) + 1 if stage in self.stages else 0
        return f"[{index}/{len(self.stages)} {stage}]" if index else f"[{stage}]"

    def enter(self, stage: str) -> None:
        self.stage = stage

    def __call__(self, message: str) -> None:
        with self.lock:
            print(f"{self.prefix()} {message}", file=self.out, flush=True)

    def stream(self, stage: str) -> _PrefixedStream:
        return _PrefixedStream(self, stage)


class _PrefixedStream:
    """A write-only text stream that prefixes every complete line with its stage."""

    def __init__(self, owner: StageProgress, stage: str) -> None:
        self.owner = owner
        self.stage = stage
        self._buffer = ""

    def write(self, text: str) -> int:
        self._buffer += text
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            with self.owner.lock:
                print(f"{self.owner.prefix(self.stage)} {line}", file=self.owner.out, flush=True)
        return len(text)

    def flush(self) -> None:
        self.owner.out.flush()
