"""Section ``crash_guard`` (issues 23 and 34): what verifying each candidate in a child process of its own
(toolkit/conversion/measure_child.py through ``crash_guard.measure``: load, held-out samples, timings) adds to
``edgetk convert``.

The trained digits CNN of the test suite, converted for ``generic-x86_64`` (TFLite and ONNX, fp32 and INT8)
with the child and without it (``crash_guard.measure`` replaced by ``measure_child.measure`` called in the
convert's own process: the same runs, no process), in interleaved pairs after one warm-up conversion of each;
builds are reused from a cache, so each conversion is the verification and the timing: the child's share is the
largest it can be. Also timed: every child on its own.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import log, table, work_dir

TITLE = "Verification in a child process: its cost in convert (issues 23, 34)"
PAIRS = 5


def run() -> tuple[str, dict[str, Any]]:
    from tests.fixtures.models import load_digits, train_digits_cnn
    from toolkit.conversion import crash_guard, measure_child
    from toolkit.conversion.pipeline import convert_bundle
    from toolkit.model.options import ConvertOptions

    root = work_dir() / "crash_guard"
    root.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    cache = Path(os.environ.get("EDGETK_TEST_CACHE", str(Path.home() / ".cache" / "edgetk-test")))
    model = train_digits_cnn(digits, cache / "models" / "digits.keras", sequential=False)
    np.savez(root / "calib.npz", image=digits.x_calib)
    np.savez(root / "eval.npz", image=digits.x_heldout, y=digits.y_heldout)
    in_child = crash_guard.measure
    children: list[float] = []

    def timed_child(job: Any, **how: Any) -> Any:
        started = time.perf_counter()
        try:
            return in_child(job, **how)
        finally:
            children.append(time.perf_counter() - started)

    def in_process(job: Any, **how: Any) -> Any:
        return measure_child.measure(job, lambda sample, words: None)

    def convert(child: bool) -> float:
        crash_guard.measure = timed_child if child else in_process  # type: ignore[assignment]
        started = time.perf_counter()
        convert_bundle(ConvertOptions(source=str(model), target="generic-x86_64", calibration=root / "calib.npz",
                                      eval_data=root / "eval.npz", out=root / "bundle", force=True,
                                      workdir=root / "builds", use_cache=False), progress=lambda m: None)
        return time.perf_counter() - started

    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        convert(True), convert(False)  # warm-up: builds cached, frameworks imported
        children.clear()
        for i in range(PAIRS):
            for child in ((True, False) if i % 2 == 0 else (False, True)):
                times[child].append(convert(child))
                log(f"crash_guard: pair {i} child={child} {times[child][-1]:.1f} s")
    finally:
        crash_guard.measure = in_child  # type: ignore[assignment]
    on, off = statistics.median(times[True]), statistics.median(times[False])
    per_child = statistics.median(children)
    per_convert = len(children) / PAIRS
    rows = [["verified in a child per candidate", f"{on:.2f} s", ", ".join(f"{t:.1f}" for t in times[True])],
            ["verified in the convert's process", f"{off:.2f} s", ", ".join(f"{t:.1f}" for t in times[False])]]
    md = [f"## {TITLE}", "", __doc__.split("\n\n", 1)[1].strip(), "",
          table(["digits CNN, generic-x86_64", "median convert", "each run (s)"], rows), "",
          f"Ratio {on / off:.2f}x ({on - off:+.2f} s). Each child (Python start, imports, load, every run of one "
          f"candidate, the result back): median {per_child:.2f} s, {per_convert:.0f} per conversion "
          f"({per_child * per_convert:.2f} s of child time per conversion)."]
    return "\n".join(md), {"ratio": on / off, "added_s": on - off, "per_child_s": per_child,
                           "children_per_convert": per_convert}
