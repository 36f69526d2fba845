"""The report's bytes: JSON without NaN, check's frame around it, written whole to a file descriptor.
"""
import json
import math
import os
from typing import Any  # noqa: F401
from .base import REPORT_MARK

# --- shipped from here (the lines above are for the host's type checker) ---

def finite_or_none(value):
    # type: (Any) -> Any
    """JSON has no NaN/Infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return dict((k, finite_or_none(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def json_bytes(doc):
    # type: (Any) -> bytes
    """``doc`` as one line of JSON (NaN and infinities written as null), UTF-8."""
    return (json.dumps(finite_or_none(doc), sort_keys=False, allow_nan=False, default=str) + "\n").encode("utf-8")


def framed(data):
    # type: (bytes) -> bytes
    """``data`` (one JSON document, ASCII) in check's frame: ``REPORT_MARK LENGTH SHA256`` on a line of its own,
    the document, ``REPORT_MARK-end`` on a line of its own. The host takes a report only from a whole frame
    whose length and sha256 agree (toolkit.model.runner_frame)."""
    import hashlib

    head = "{} {} {}\n".format(REPORT_MARK, len(data), hashlib.sha256(data).hexdigest()).encode("ascii")
    return head + data + (REPORT_MARK + "-end\n").encode("ascii")


def write_all(fd, data):
    # type: (int, bytes) -> None
    """All of ``data`` to ``fd`` (os.write may take part of it)."""
    while data:
        data = data[os.write(fd, data):]
