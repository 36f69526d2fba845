"""Section ``selective`` (issue 13): wall time of a ResNet50 conversion whose full INT8 fails the tolerance, so
selective quantization runs: the plain INT8 artifact, the layer-wise table, the rebuilds with the float layers
the table picks (each verified), on the PyTorch -> TFLite route (litert-torch PT2E; ResNet50 from
``benchmarks/resnet.py``, random weights with BatchNorm statistics re-estimated: for time only).

The profile asks for a cosine of 0.99999 against float, which no INT8 artifact of ResNet50 reaches: every
selective step runs (the worst case). Stage times come from the progress messages' timestamps, in one run.
Target (issue 13): under 3 minutes on 2 cores; before the table it took 303 s (Keras ResNet50), when each
selective retry was a full conversion.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import log, table, work_dir

TITLE = "Selective quantization, ResNet50 (issue 13)"
CALIB, EVAL = 32, 8
PROFILE = """extends = "raspberry-pi-4"
fallback = ["int8", "fp32"]
[tolerance]
min_cosine = 0.99999
[[recipes]]
format = "tflite"
precision = "int8"
io_dtype = "int8"
[[recipes]]
format = "tflite"
precision = "fp32"
"""


def convert_timed(source: str, root: Path) -> tuple[float, float, list[tuple[str, float]], Any]:
    """(wall s, CPU s of this process, [(stage, seconds)], manifest) of one convert_bundle run."""
    from toolkit.pipeline import ConvertOptions, convert_bundle

    profiles = root / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "selective-bench.toml").write_text(PROFILE)
    rng = np.random.default_rng(0)
    np.savez(root / "calib.npz", x=rng.standard_normal((CALIB, 3, 224, 224)).astype(np.float32))
    np.savez(root / "eval.npz", x=rng.standard_normal((EVAL, 3, 224, 224)).astype(np.float32))
    marks: list[tuple[str, float]] = []
    started, cpu = time.perf_counter(), time.process_time()

    def progress(message: str) -> None:
        marks.append((message, time.perf_counter() - started))
        log(f"selective: {message}")

    result = convert_bundle(
        ConvertOptions(source=source, target="selective-bench", targets_dirs=(profiles,), calibration=root / "calib.npz",
                       eval_data=root / "eval.npz", out=root / "bundle", force=True, use_cache=False),
        progress=progress,
    )
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    stages = [(a[0], b[1] - a[1]) for a, b in zip(marks, [*marks[1:], ("end", wall)])]
    return wall, cpu, stages, result.manifest


def run() -> tuple[str, dict[str, Any]]:
    parts = [f"## {TITLE}", ""]
    if importlib.util.find_spec("litert_torch") is None:
        return "\n".join(parts + ["litert-torch is not installed: not measured (`pip install -e '.[all]'`)."]), {}
    root = work_dir() / "selective"
    source = f"{Path(__file__).with_name('resnet.py')}:resnet50"
    wall, cpu, stages, manifest = convert_timed(source, root)
    rows = [[message[:110], f"{seconds:.1f} s"] for message, seconds in stages if seconds >= 0.5]
    attempts = [[a.recipe["precision"], len(a.recipe["nodes_to_exclude"]), a.outcome, a.reason[:90]]
                for a in manifest.attempts]
    parts += [
        f"ResNet50 PyTorch -> TFLite, {CALIB} calibration and {EVAL} eval samples (random inputs), "
        f"`{os.cpu_count()}` cores, load average {os.getloadavg()[0]:.1f} at the end: **{wall:.0f} s wall** "
        f"({cpu:.0f} s CPU of the converting process).", "",
        table(["stage (progress message)", "wall time"], rows), "",
        table(["recipe", "float layers", "outcome", "reason"], attempts), "",
    ]
    return "\n".join(parts), {"resnet50_torch_tflite_s": wall, "resnet50_torch_tflite_cpu_s": cpu}


if __name__ == "__main__":
    text, figures = run()
    print(text)
    print(figures)
