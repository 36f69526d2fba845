"""A runtime that crashes on an artifact (a kernel's segfault or abort) ends a child process, not the convert run
(findings.md 6: an INT8 TFLite that crashes its interpreter).

Two children. ``measure`` runs every verification run of one candidate (``measure_child``: load, the held-out
samples, the sequence, the timings, the batch sizes) in one child per candidate: a crash drops that candidate with
the signal and the stage the child announced last, and the convert goes on with the others. ``first_run``
(``toolkit.runtimes.execution.first_run``, one held-out input) guards a build step that loads the artifact in this
process (the INT8 ONNX route's own checks). A crash on one input is narrowed to its op: the graph cut after an op
(``graph_cuts``, by bisection) is run the same way, and the first op whose cut crashes is named as its runtime
names a failing node (LiteRT's ``Node number 4 (FULLY_CONNECTED)``, onnxruntime's ``Conv node. Name:'conv_1'``),
which ``runtime_retry`` keeps in float. A ``.pte`` is not cut: its crash is named by signal only. An ordinary
error in ``first_run``'s child is not a crash: the in-process load reports it.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.conversion.measure_child import (FIRST, LOADING, Measurement, MeasureJob, RunFailed, RunProblem,
                                              read_feeds)

if TYPE_CHECKING:
    from toolkit.conversion.backend import Backend

MEASURE_TIMEOUT_S = 1800.0  # a candidate's whole verification: a child still running then is stopped, and failed
TIMEOUT_S = 300.0  # a child that takes longer is left: the in-process load decides (a big model is not a crash)
_SURVIVED: set[tuple[int, int, int]] = set()  # files whose first run passed in a child: run once per process


@dataclass(frozen=True)
class Crash:
    """How the child running an artifact died: by a signal (``SIGSEGV``, ``SIGABRT``)."""

    runtime: str  # "the interpreter"
    how: str  # "SIGSEGV"
    when: str  # "while loading it", "at its first inference", "while verifying it on held-out sample 3"
    node: str | None  # "Node number 4 (FULLY_CONNECTED)", "Conv node. Name:'c1'": the first op whose cut crashes
    stack: str = ""  # the child's Python stack at the crash (faulthandler), for --debug

    def reason(self, what: str) -> str:
        """``the int8 TFLite crashed the interpreter at its first inference (SIGSEGV)``."""
        text = f"the {what} crashed {self.runtime} {self.when} ({self.how})"
        return text + (f"; the graph up to {self.node} alone crashes it too" if self.node else "")


def _child(path: Path, feeds: Path, threads: int | None) -> tuple[int | None, str]:
    """The child's exit status (negative: the signal; None: stopped at the timeout) and its standard output."""
    status, out, _ = _python("toolkit.runtimes.execution.first_run", [str(path), str(feeds)]
                             + ([str(threads)] if threads else []), TIMEOUT_S)
    return status, out


def _python(module: str, args: list[str], timeout: float) -> tuple[int | None, str, str]:
    """``python -m module args``: its exit status (negative: the signal; None: stopped at the timeout), standard
    output and standard error."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the toolkit package
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    try:
        done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, env=env, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return None, "", ""
    return done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")


def first_run(path: Path, feed: Mapping[str, np.ndarray], *, backend: Backend, threads: int | None,
              scratch: Path) -> Crash | None:
    """Run ``path`` once on ``feed`` (keyed by the artifact's input names) in a child; the crash, if it crashed."""
    if _identity(path) in _SURVIVED:
        return None
    feeds = scratch / "first-run-feed.npz"
    # Any: np.savez types **arrays against its own allow_pickle: bool
    arrays: dict[str, Any] = {name: np.asarray(value) for name, value in feed.items()}
    np.savez(feeds, **arrays)
    status, out = _child(path, feeds, threads)
    if status == 0:
        _SURVIVED.add(_identity(path))
    if status is None or status >= 0:
        return None
    try:
        node = _crashing_node(path, backend, feeds, threads, scratch)
    except Exception:  # noqa: BLE001 - a graph that cannot be cut (a 2 GB protobuf): the crash, without its op
        node = None
    when = FIRST if "loaded" in out.split() else LOADING
    return Crash(backend.runtime, _signal_name(-status), when, node)


def measure(job: MeasureJob, *, backend: Backend, scratch: Path) -> Measurement | RunFailed | Crash:
    """Every run of ``job`` (``measure_child``) in one child: what it measured, the exception that stopped it, or
    the crash that killed it, at the stage it announced last (its op found by cutting the graph where the crash
    was on one held-out sample)."""
    job_path, result_path = scratch / "measure-job.pkl", scratch / "measure-result.pkl"
    job_path.write_bytes(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
    result_path.unlink(missing_ok=True)
    status, out, err = _python("toolkit.conversion.measure_child", [str(job_path), str(result_path)],
                               MEASURE_TIMEOUT_S)
    if status == 0 and result_path.is_file():
        result: Measurement | RunFailed = pickle.loads(result_path.read_bytes())
        return result
    sample, when = _last_stage(out)
    if status is None or status >= 0:  # a timeout or an exit without a result (out of memory, an exit() inside)
        how = f"took longer than {MEASURE_TIMEOUT_S:.0f} s" if status is None else f"exit status {status}"
        return RunFailed(RunProblem.RUN, when, f"its verification process ended without a result ({how})", None,
                         "" if status is None else "SystemExit", None, err[-4000:])
    node = None
    held = read_feeds(job.feeds) if sample is not None and job.artifact_inputs else ()
    if sample is not None and sample < len(held):
        feeds = scratch / "first-run-feed.npz"
        feed = held[sample]
        arrays: dict[str, Any] = {name: np.asarray(feed[spec.name])  # Any: as above
                                  for spec, name in zip(job.inputs, job.artifact_inputs)}
        np.savez(feeds, **arrays)
        try:
            node = _crashing_node(job.artifact, backend, feeds, job.threads, scratch)
        except Exception:  # noqa: BLE001 - a graph that cannot be cut: the crash, without its op
            node = None
    return Crash(backend.runtime, _signal_name(-status), when, node, _fault_stack(err))


def _last_stage(out: str) -> tuple[int | None, str]:
    """The held-out sample and words of the stage the child announced last (``stage|3|while ...``)."""
    lines = [line.split("|", 2) for line in out.splitlines() if line.startswith("stage|")]
    if not lines or len(lines[-1]) != 3:
        return 0, LOADING
    _, sample, words = lines[-1]
    return (int(sample) if sample.isdigit() else None), words


def _fault_stack(err: str) -> str:
    """The Python stack faulthandler wrote at the crash (from ``Fatal Python error``), or the end of stderr."""
    start = err.find("Fatal Python error")
    return err[start:] if start >= 0 else err[-4000:]


def _identity(path: Path) -> tuple[int, int, int]:
    """The file at ``path`` as this process last saw it (a rename keeps it: the build's check, then convert's)."""
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _crashing_node(path: Path, backend: Backend, feeds: Path, threads: int | None, scratch: Path) -> str | None:
    """The first op of the main graph whose cut (the graph up to it, its outputs the model's; ``backend.cuts``)
    crashes the child, named as the runtime names a failing op; None where the format is not cut or no cut crashes
    alone."""
    from toolkit.conversion.graph_cuts import first_failing

    graph = backend.cuts(path)
    if graph is None:
        return None
    cut_path = scratch / f"first-run-cut{path.suffix}"

    def crashes(ops: int) -> bool:
        cut_path.write_bytes(graph.cut(ops))
        status, _ = _child(cut_path, feeds, threads)
        return status is not None and status < 0

    found = first_failing(graph.count, crashes)
    return None if found is None else graph.name(found)
