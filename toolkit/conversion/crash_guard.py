"""Each artifact's first load and inference runs in a child process before this one loads it: a runtime that
crashes on an artifact (a kernel's segfault or abort) ends the child, and the convert run goes on with a failed
attempt that says so (findings.md 6: an INT8 TFLite that crashes its interpreter).

The child is ``toolkit.runtimes.execution.first_run`` on one held-out input. A crash in a TFLite or ONNX artifact
is narrowed to its op: the graph cut after an op (``graph_cuts``, by bisection) is run the same way, and the
first op whose cut crashes is named as its runtime names a failing node (LiteRT's ``Node number 4
(FULLY_CONNECTED)``, onnxruntime's ``Conv node. Name:'conv_1'``), which ``runtime_retry`` keeps in float. A
``.pte`` is not cut: its crash is named by signal only. An ordinary error in the child is not a crash: the
in-process load reports it (a node it names is retried the same way).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.model.vocabulary import Format

TIMEOUT_S = 300.0  # a child that takes longer is left: the in-process load decides (a big model is not a crash)
_SURVIVED: set[tuple[int, int, int]] = set()  # files whose first run passed in a child: run once per process
_RUNTIMES = {Format.TFLITE: "the interpreter", Format.ONNX: "onnxruntime", Format.PTE: "ExecuTorch"}


@dataclass(frozen=True)
class Crash:
    """How the child running an artifact died: by a signal (``SIGSEGV``, ``SIGABRT``)."""

    runtime: str  # "the interpreter"
    how: str  # "SIGSEGV"
    loaded: bool  # the runtime had loaded the artifact: the inference crashed
    node: str | None  # "Node number 4 (FULLY_CONNECTED)", "Conv node. Name:'c1'": the first op whose cut crashes

    def reason(self, what: str) -> str:
        """``the int8 TFLite crashed the interpreter at its first inference (SIGSEGV)``."""
        when = "at its first inference" if self.loaded else "while loading it"
        text = f"the {what} crashed {self.runtime} {when} ({self.how})"
        return text + (f"; the graph up to {self.node} alone crashes it too" if self.node else "")


def _child(path: Path, feeds: Path, threads: int | None) -> tuple[int | None, str]:
    """The child's exit status (negative: the signal; None: stopped at the timeout) and its standard output."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the toolkit package
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, "-m", "toolkit.runtimes.execution.first_run", str(path), str(feeds)]
    try:
        done = subprocess.run(command + ([str(threads)] if threads else []), capture_output=True, env=env,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, ""
    return done.returncode, done.stdout.decode("utf-8", "replace")


def first_run(path: Path, feed: Mapping[str, np.ndarray], *, artifact_format: Format, threads: int | None,
              scratch: Path) -> Crash | None:
    """Run ``path`` once on ``feed`` (keyed by the artifact's input names) in a child; the crash, if it crashed."""
    if _identity(path) in _SURVIVED:
        return None
    feeds = scratch / "first-run-feed.npz"
    arrays: dict[str, Any] = {name: np.asarray(value) for name, value in feed.items()}
    np.savez(feeds, **arrays)
    status, out = _child(path, feeds, threads)
    if status == 0:
        _SURVIVED.add(_identity(path))
    if status is None or status >= 0:
        return None
    try:
        node = _crashing_node(path, artifact_format, feeds, threads, scratch)
    except Exception:  # noqa: BLE001 - a graph that cannot be cut (a 2 GB protobuf): the crash, without its op
        node = None
    return Crash(_RUNTIMES[artifact_format], _signal_name(-status), "loaded" in out.split(), node)


def _identity(path: Path) -> tuple[int, int, int]:
    """The file at ``path`` as this process last saw it (a rename keeps it: the build's check, then convert's)."""
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _crashing_node(path: Path, artifact_format: Format, feeds: Path, threads: int | None,
                   scratch: Path) -> str | None:
    """The first op of the main graph whose cut (the graph up to it, its outputs the model's) crashes the child,
    named as the runtime names a failing op; None where the format is not cut or no cut crashes alone."""
    from toolkit.conversion.graph_cuts import cuts, first_failing

    graph = cuts(path, artifact_format)
    if graph is None:
        return None
    cut_path = scratch / f"first-run-cut{path.suffix}"

    def crashes(ops: int) -> bool:
        cut_path.write_bytes(graph.cut(ops))
        status, _ = _child(cut_path, feeds, threads)
        return status is not None and status < 0

    found = first_failing(graph.count, crashes)
    return None if found is None else graph.name(found)
