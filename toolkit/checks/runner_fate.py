"""Whether one run of the device runner is evidence, and if not, what happened to it.

A report counts only when the run is whole: the runner exited 0 (or 2 with its usage report), no signal killed
it, and its report came in a whole frame (:mod:`toolkit.model.runner_frame`). Anything else fails the check
as a device error (exit code 4, :class:`RunnerFailed`), whatever the runner printed, and nothing is recorded:

- out of memory (``out_of_memory``): its stderr names an allocation failure (``MemoryError``,
  ``std::bad_alloc``, a library that cannot be mapped under ``ulimit -v``), or SIGKILL (or exit 137, a shell's
  way of saying so) while the kernel's OOM-kill count rose: the runner's first memory line on stderr holds the
  counts when it started, the device's ``edgetk_runner.py memory`` gives them now. The verdict names the
  artifacts' sizes, the peak the runner saw, MemAvailable and the cgroup and ``ulimit -v`` limits, and what to try;
- killed (``killed``): any other signal (or exit code 128 + N, a shell's report of one), the signal named;
  another non-zero exit code is a ``crash`` of the runner, its stderr's tail shown;
- a bad report (``bad_report``): no frame, a frame cut or changed; what was printed outside it is shown.

A whole frame with other text around it (a ``sitecustomize`` that prints) is evidence; the text is shown as a
warning, never parsed. An artifact that ran out of memory inside a run that is whole is the runner's own
``out_of_memory`` report for that artifact (the check fails with exit code 1, the selection skips it).
"""

from __future__ import annotations

import json
import logging
import re
import signal
from collections.abc import Mapping

from toolkit.delivery.deployment import Device
from toolkit.errors import DeviceError
from toolkit.model.device_records import CommandResult
from toolkit.model.records import JsonObject
from toolkit.model.runner_frame import Frame, memory_seen, read_frame, unframed_document, without_marks
from toolkit.model.vocabulary import RunnerErrorKind

log = logging.getLogger(__name__)
MEMORY_WORDS = re.compile(r"MemoryError|bad_alloc|out of memory|Cannot allocate memory|failed to map segment|"
                          r"Failed to allocate|Unable to allocate|Memory allocation|ENOMEM", re.I)  # the runner's MEMORY_WORDS
OOM_HINT = ("Try a smaller artifact (an int8 one), fewer threads (--threads 1), or free memory on the device "
            "(stop other services, or raise its cgroup's memory limit or `ulimit -v`).")
KILLED_HINT = ("Something on the device ended it (a watchdog, a supervisor, `timeout`, a container's limit): "
               "look at `dmesg` and the system journal there, then check again.")
CRASH_HINT = "Run the runner by hand there to see why: python3 edgetk_runner.py check --bundle DIR."
BAD_REPORT_HINT = ("Something on the device prints to stdout when Python starts (a sitecustomize, a .pth file) or "
                   "cut the output; run the runner by hand there: python3 edgetk_runner.py check --bundle DIR.")
MEMORY_PROBE_S = 30.0
SHELL_KILLED = 128  # a shell reports a child killed by signal N as exit code 128 + N


class RunnerFailed(DeviceError):
    """The runner's run as a whole is no evidence (``kind``: out_of_memory, killed, crash or bad_report)."""

    def __init__(self, message: str, *, kind: RunnerErrorKind, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.kind = kind


def _tail(text: str, lines: int = 3) -> str:
    kept = [line for line in text.strip().split("\n") if line.strip()][-lines:]
    return " | ".join(kept)[-400:]


def _fate(result: CommandResult) -> tuple[str, signal.Signals | None]:
    """How the run ended, in words, and the signal behind it (from the connection, or a shell's 128 + N)."""
    if result.signal:
        try:
            number: signal.Signals | None = signal.Signals[result.signal]
        except KeyError:
            number = None
        return f"was killed by {result.signal}", number
    code = result.returncode
    if code > SHELL_KILLED:
        try:
            sig = signal.Signals(code - SHELL_KILLED)
            return f"exited with code {code} ({SHELL_KILLED} + {sig.value}: {sig.name}, as a shell reports a child " \
                   f"killed by it)", sig
        except ValueError:
            pass
    return f"exited with code {code}", None


def _memory_now(device: Device, runner: str, cgroup: object) -> JsonObject | None:
    """The device's memory facts now (``edgetk_runner.py memory``), None when they cannot be had."""
    argv = [device.python, runner, "memory", *(["--cgroup", str(cgroup)] if cgroup else [])]
    try:
        result = device.conn.run(argv, timeout=MEMORY_PROBE_S)
        data = json.loads(result.stdout.strip().splitlines()[-1]) if result.ok and result.stdout.strip() else None
    except (DeviceError, json.JSONDecodeError, IndexError):
        return None
    return data if isinstance(data, dict) else None


def _oom_rose(before: JsonObject | None, after: JsonObject | None) -> bool | None:
    """Whether an OOM-kill count (system, cgroup) rose from ``before`` to ``after`` (None: unknown)."""
    old, new = (before or {}).get("oom_kills") or {}, (after or {}).get("oom_kills") or {}
    known = [k for k in ("system", "cgroup") if isinstance(old.get(k), int) and isinstance(new.get(k), int)]
    return any(new[k] > old[k] for k in known) if known else None


def _mb(value: object) -> str:
    return f"{value:g} MB" if isinstance(value, (int, float)) else "unknown"


def out_of_memory_text(name: str, how: str, sizes: Mapping[str, int], seen: JsonObject | None,
                       now: JsonObject | None) -> str:
    """The verdict: what ran out of memory and how, the artifacts' sizes, the peak seen, what the device has."""
    facts = dict(now or {})
    files = ", ".join(f"{f} {size / 1e6:.1f} MB" if size >= 100_000 else f"{f} {size / 1e3:.1f} KB"
                      for f, size in sizes.items()) or "none"
    has = [f"MemAvailable {_mb(facts.get('available_mb'))}"]
    if facts.get("cgroup_limit_mb") is not None:
        has.append(f"cgroup limit {_mb(facts.get('cgroup_limit_mb'))}")
    if facts.get("address_space_limit_mb") is not None:
        has.append(f"ulimit -v {_mb(facts.get('address_space_limit_mb'))}")
    peaks = [p for p in ((seen or {}).get("peak_rss_mb"), facts.get("cgroup_peak_mb")) if isinstance(p, (int, float))]
    peak = max(peaks) if peaks else None  # the runner's own at its last memory line, its cgroup's high mark
    return (f"{name}: out of memory on the device: the runner {how}. Artifacts: {files}; peak the runner saw: "
            f"{_mb(peak)}; the device has {', '.join(has)}.")


def evidence(device: Device, result: CommandResult, *, runner: str, sizes: Mapping[str, int]) -> str:
    """The JSON text of the runner's report when ``result`` is a whole run (module docstring), else
    :class:`RunnerFailed`. ``runner``: the runner's path on the device; ``sizes``: artifact file -> bytes."""
    name = device.spec.name
    frame = read_frame(result.stdout)
    stderr = without_marks(result.stderr)
    seen = memory_seen(result.stderr)
    if result.signal is None and result.returncode in (0, 2) and frame.document is None:
        legacy = unframed_document(result.stdout)
        if legacy is not None:
            return legacy
    if result.signal is None and result.returncode in (0, 2) and frame.document is not None:
        if frame.outside.strip():
            log.warning("%s: the device's Python printed outside the runner's report (shown, not parsed): %s", name,
                        frame.shown_outside())
        return frame.document
    if result.signal is None and result.returncode != 0:
        missing = result.returncode == 127 or re.search(r"not found|No such file", _tail(stderr, 1))
        if missing and frame.document is None and not MEMORY_WORDS.search(stderr):
            raise DeviceError(
                f"{name}: the runner failed with exit code {result.returncode} and no report ({_tail(stderr, 1)}).",
                hint=f"Is {device.python!r} a working Python on the device? Set `python` in the inventory.",
            )
    if result.signal is not None or result.returncode != 0:
        _killed(device, result, frame, stderr, seen, runner=runner, sizes=sizes)
    outside = frame.shown_outside()
    raise RunnerFailed(
        f"{name}: the runner's report is not evidence: {frame.problem}"
        + (f"; printed outside a report: {outside}" if outside else "")
        + (f"; stderr: {_tail(stderr)}" if stderr.strip() else "") + ". Nothing was recorded.",
        kind=RunnerErrorKind.BAD_REPORT, hint=BAD_REPORT_HINT)


def _killed(device: Device, result: CommandResult, frame: Frame, stderr: str, seen: JsonObject | None, *,
            runner: str, sizes: Mapping[str, int]) -> None:
    """Raise what a run that ended with a signal or a non-zero exit code was: out of memory, or killed."""
    name = device.spec.name
    how, sig = _fate(result)
    printed = ("after printing a whole report (not evidence: the run was not whole)" if frame.document is not None
               else "before printing a whole report")
    words = MEMORY_WORDS.search(stderr)
    now: JsonObject | None = None
    rose: bool | None = None
    if sig == signal.SIGKILL:
        now = _memory_now(device, runner, (seen or {}).get("cgroup"))
        rose = _oom_rose(seen, now) if seen is not None else None
    if words or rose:
        why = f"stderr says {words.group(0)!r}" if words else "the kernel's OOM-kill count rose"
        raise RunnerFailed(out_of_memory_text(name, f"{how} {printed}; {why}", sizes, seen, now)
                           + " Nothing was recorded.", kind=RunnerErrorKind.OUT_OF_MEMORY, hint=OOM_HINT)
    if sig == signal.SIGKILL:
        cause = ("; not by the kernel's out-of-memory killer (its OOM-kill count did not rise)" if rose is False
                 else "; the kernel's OOM-kill count could not be compared")
    else:
        cause = ""
    detail = f" ({_tail(stderr)})" if stderr.strip() else ""
    raise RunnerFailed(f"{name}: the runner {how} {printed}{cause}{detail}. Nothing was recorded.",
                       kind=RunnerErrorKind.KILLED if sig is not None else RunnerErrorKind.CRASH,
                       hint=KILLED_HINT if sig is not None else CRASH_HINT)
