"""Section ``crash_guard`` (issue 23): what running each artifact's first load and inference in a child process
(toolkit/conversion/crash_guard.py) adds to ``edgetk convert``.

The trained digits CNN of the test suite, converted for ``generic-x86_64`` (TFLite and ONNX, fp32 and INT8)
with the guard and without it (``candidate._crashed`` replaced by a no-op), in interleaved pairs after one
warm-up conversion of each; builds are reused from a cache, so each conversion is the verification, the
timing and the guard: the guard's share is the largest it can be. Also timed: every child on its own.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import log, table, work_dir

TITLE = "Crash guard: the child first run's cost in convert (issue 23)"
PAIRS = 5


def run() -> tuple[str, dict[str, Any]]:
    from tests.fixtures.models import load_digits, train_digits_cnn
    from toolkit.conversion import candidate, crash_guard
    from toolkit.conversion.pipeline import convert_bundle
    from toolkit.model.options import ConvertOptions

    root = work_dir() / "crash_guard"
    root.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    cache = Path(os.environ.get("EDGETK_TEST_CACHE", str(Path.home() / ".cache" / "edgetk-test")))
    model = train_digits_cnn(digits, cache / "models" / "digits.keras", sequential=False)
    np.savez(root / "calib.npz", image=digits.x_calib)
    np.savez(root / "eval.npz", image=digits.x_heldout, y=digits.y_heldout)
    guarded, child = candidate._crashed, crash_guard._child
    children: list[float] = []

    def timed_child(*args: Any) -> Any:
        started = time.perf_counter()
        try:
            return child(*args)
        finally:
            children.append(time.perf_counter() - started)

    def convert(guard: bool) -> float:
        candidate._crashed = guarded if guard else (lambda *a: None)  # type: ignore[assignment]
        started = time.perf_counter()
        convert_bundle(ConvertOptions(source=str(model), target="generic-x86_64", calibration=root / "calib.npz",
                                      eval_data=root / "eval.npz", out=root / "bundle", force=True,
                                      workdir=root / "builds", use_cache=False), progress=lambda m: None)
        return time.perf_counter() - started

    times: dict[bool, list[float]] = {True: [], False: []}
    crash_guard._child = timed_child  # type: ignore[assignment]
    try:
        convert(True), convert(False)  # warm-up: builds cached, frameworks imported
        children.clear()
        for i in range(PAIRS):
            for guard in ((True, False) if i % 2 == 0 else (False, True)):
                times[guard].append(convert(guard))
                log(f"crash_guard: pair {i} guard={guard} {times[guard][-1]:.1f} s")
    finally:
        candidate._crashed, crash_guard._child = guarded, child  # type: ignore[assignment]
    on, off = statistics.median(times[True]), statistics.median(times[False])
    per_child = statistics.median(children)
    per_convert = len(children) / PAIRS
    rows = [["with the guard", f"{on:.2f} s", ", ".join(f"{t:.1f}" for t in times[True])],
            ["without it", f"{off:.2f} s", ", ".join(f"{t:.1f}" for t in times[False])]]
    md = [f"## {TITLE}", "", __doc__.split("\n\n", 1)[1].strip(), "",
          table(["digits CNN, generic-x86_64", "median convert", "each run (s)"], rows), "",
          f"Ratio {on / off:.2f}x ({on - off:+.2f} s). Each child (Python start, runtime import, load, one "
          f"inference): median {per_child:.2f} s, {per_convert:.0f} per conversion "
          f"({per_child * per_convert:.2f} s of child time per conversion)."]
    return "\n".join(md), {"ratio": on / off, "added_s": on - off, "per_child_s": per_child,
                           "children_per_convert": per_convert}
