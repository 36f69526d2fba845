"""The runner's words: its version, the error kinds, the defaults, the runtime table's derived tables and the
one exception it reports.
"""
import signal
import time
from typing import Any  # noqa: F401
from shared import RUNTIME_ROWS

# --- shipped from here (the lines above are for the host's type checker) ---

RUNNER_VERSION = "2"  # 2: check's report is framed (1 printed it plain: the host still reads that)


ERROR_KINDS = (
    "missing_runtime",
    "unsupported_op",
    "corrupt_artifact",
    "integrity",
    "crash",
    "bad_bundle",
    "usage",
    "out_of_memory",
    "killed",
    "bad_report",
)


REPORT_MARK = "\x1eedgetk-report"  # check's document: MARK LENGTH SHA256 \n JSON MARK-end \n (docs/runner.md)


MEMORY_MARK = "\x1eedgetk-memory "  # a line on stderr: the memory this run saw so far (the host reads the last)


DEFAULT_RUNS = 100


DEFAULT_WARMUP = 10


DEFAULT_TIMEOUT = 600.0


MAX_TIMED_RUNS = 1000000


def timed_calls(call, args, runs, min_time):
    # type: (Any, tuple, int, float) -> list
    """Seconds of each ``call(*args)``: ``runs`` calls, more until ``min_time`` seconds have passed (at most
    MAX_TIMED_RUNS). Only the call is timed; the loop binds its names once so that microsecond models are not
    dominated by attribute lookups."""
    clock = time.perf_counter
    times = []  # type: list
    append = times.append
    start = clock()
    while len(times) < runs or (clock() - start < min_time and len(times) < MAX_TIMED_RUNS):
        t0 = clock()
        call(*args)
        append(clock() - t0)
    return times


# --- runtime table: shared.py's block, inlined here when assembled (toolkit.device_side) ---


def _runtimes(fmt):
    # type: (str) -> tuple
    return tuple(row["runtime"] for row in RUNTIME_ROWS if row["format"] == fmt)


TFLITE_RUNTIMES = _runtimes("tflite")


ONNX_RUNTIMES = _runtimes("onnx")


PTE_RUNTIMES = _runtimes("pte")


# runtime name -> (import name, distribution names to ask for its version, in order); numpy is asked for too
PACKAGES = {row["runtime"]: (row["module"], row["distributions"]) for row in RUNTIME_ROWS}


PACKAGES["numpy"] = ("numpy", ("numpy",))


INSTALL_HINTS = {row["runtime"]: row["install_hint"] for row in RUNTIME_ROWS}


# Debian 12 refuses a plain `pip install numpy` (externally managed): setup makes a venv on the device.
INSTALL_HINTS["numpy"] = (
    "Run `edgetk devices setup --device DEVICE` on the host (numpy and a runtime, in a venv on the device)")


REDEPLOY_HINT = "Push the bundle again (`edgetk deploy`), or rebuild it (`edgetk convert`) if the host copy is bad."


class RunnerError(Exception):
    """A failure the runner reports as ``{"kind", "message", "hint"}`` instead of a traceback."""

    def __init__(self, kind, message, hint=None, detail=None):
        # type: (str, str, Any, Any) -> None
        Exception.__init__(self, message)
        self.kind = kind
        self.message = message
        self.hint = hint
        self.detail = detail

    def to_dict(self):
        # type: () -> dict
        out = {"kind": self.kind, "message": self.message, "hint": self.hint}
        if self.detail:
            out["detail"] = self.detail
        return out


class UsageFailure(Exception):
    """Raised by the argument parser instead of printing usage text and exiting."""


def signal_name(number):
    # type: (int) -> str
    """The name of signal ``number`` (SIGKILL), or "signal N" for one this Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return "signal {}".format(number)
