"""The frame the device runner's ``check`` puts its report in, read back: a report is evidence only when its
frame is whole. The runner (``toolkit/device_side/src/edgetk_runner.py``, ``framed``) writes::

    \\x1eedgetk-report LENGTH SHA256
    {one JSON document, LENGTH bytes with its newline}
    \\x1eedgetk-report-end

Whatever else is on stdout (a line a ``sitecustomize`` or a ``.pth`` file prints when Python starts, a native
library's chatter) is outside the frame: shown to the user, never parsed. A frame whose document is shorter
than its length, whose sha256 differs or whose end mark is missing was cut: no report. On stderr the runner
writes ``\\x1eedgetk-memory {JSON}`` lines (what memory it saw so far); the last one is what the host reports
when the runner is killed as a whole (:mod:`toolkit.checks.runner_fate`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from toolkit.model.records import JsonObject

REPORT_MARK = "\x1eedgetk-report"  # the runner's REPORT_MARK (tests/runner checks the two agree)
MEMORY_MARK = "\x1eedgetk-memory "  # the runner's MEMORY_MARK
_HEAD = re.compile(re.escape(REPORT_MARK) + r" (\d+) ([0-9a-f]{64})\n")
SHOWN_CHARS = 300  # of the text outside the frame, in a message


@dataclass(frozen=True)
class Frame:
    """What the runner's stdout held: ``document`` (the JSON text of a whole frame, else None), ``outside``
    (everything else, stripped) and, when there is no whole frame, ``problem`` (why, in words)."""

    document: str | None
    outside: str
    problem: str | None = None

    def shown_outside(self) -> str:
        """The text outside the frame as a message shows it (its first SHOWN_CHARS characters), or ''."""
        text = self.outside.strip()
        return repr(text[:SHOWN_CHARS] + ("..." if len(text) > SHOWN_CHARS else "")) if text else ""


def read_frame(stdout: str) -> Frame:
    """The report framed in ``stdout`` (the last frame when there are several), and what is outside it."""
    heads = list(_HEAD.finditer(stdout))
    if not heads:
        at = stdout.find(REPORT_MARK[:7])  # its record separator and "edgetk": the head, cut in its first line
        if at >= 0:
            return Frame(None, stdout[:at], "its report's first line was cut")
        return Frame(None, stdout, "it printed no framed report")
    head = heads[-1]
    length, digest = int(head.group(1)), head.group(2)
    start = head.end()
    body = stdout[start:start + length]
    before = stdout[:head.start()]
    if len(body.encode("utf-8")) < length:
        return Frame(None, before, f"its report was cut after {len(body.encode('utf-8'))} of {length} bytes")
    if hashlib.sha256(body.encode("utf-8")).hexdigest() != digest:
        return Frame(None, before, "its report does not match its sha256 (changed or cut on the way)")
    end_mark = REPORT_MARK + "-end\n"
    rest = stdout[start + length:]
    if not rest.startswith(end_mark):
        return Frame(None, before, "its report has no end mark (cut, or something wrote into it)")
    return Frame(body, before + rest[len(end_mark):])


UNFRAMED_VERSION = "1"  # runners before the frame (in bundles built by an older edgetk) print plain JSON


def unframed_document(stdout: str) -> str | None:
    """The report of a runner from before the frame (``runner_version`` 1, in a bundle built by an older edgetk):
    taken only when stdout is exactly that one JSON document, as it was then; None otherwise."""
    text = stdout.strip()
    try:
        doc = json.loads(text) if text.startswith("{") else None
    except json.JSONDecodeError:
        return None
    return text if isinstance(doc, dict) and doc.get("runner_version") == UNFRAMED_VERSION else None


def memory_seen(stderr: str) -> JsonObject | None:
    """The runner's last memory line on ``stderr`` (:data:`MEMORY_MARK`), None when it wrote none."""
    for line in reversed(stderr.split("\n")):  # not splitlines: it splits at the mark's \x1e too
        if line.startswith(MEMORY_MARK):
            try:
                data = json.loads(line[len(MEMORY_MARK):])
            except json.JSONDecodeError:
                continue
            return data if isinstance(data, dict) else None
    return None


def without_marks(stderr: str) -> str:
    """``stderr`` without the runner's memory lines (what a message shows of it)."""
    return "\n".join(line for line in stderr.split("\n") if not line.startswith(MEMORY_MARK))
