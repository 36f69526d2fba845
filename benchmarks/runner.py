"""Section ``runner`` (issue 5): the on-device runner's reported p50 vs a bare invoke loop in the same runtime
and the same Python (the device env: numpy + onnxruntime + ai-edge-litert only, when it exists).

Artifacts: MobileNetV2 (224x224, random weights) fp32 and int8, TFLite and ONNX, built by the toolkit (cached
between runs). For each artifact the two measurements alternate, each a fresh process: ``edgetk_runner.py
run-one`` (its own warm-up and timed runs; it reports p50) and a bare loop written the way the runtime's docs
time a model (set the input once, time ``invoke()`` for TFLite, ``session.run`` for ONNX Runtime).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import THREADS, log, table, work_dir

TITLE = "Runner: reported p50 vs a bare loop (issue 5)"
ROUNDS = 5
RUNS = 100
WARMUP = 20

BARE = r"""
import json, sys, time
import numpy as np
bundle, artifact, threads, runs, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
x = np.load(bundle + "/golden/inputs.npz")["input_0"][0]
times = []
if artifact.endswith(".tflite"):
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=bundle + "/" + artifact, num_threads=threads)
    it.allocate_tensors()
    d = it.get_input_details()[0]
    scale, zero = d["quantization"]
    if scale and np.issubdtype(d["dtype"], np.integer):
        info = np.iinfo(d["dtype"])
        x = np.clip(np.round(x / scale + zero), info.min, info.max)
    it.set_tensor(d["index"], x.astype(d["dtype"]).reshape(d["shape"]))
    for _ in range(warmup + 1):
        it.invoke()
    for _ in range(runs):
        t = time.perf_counter(); it.invoke(); times.append(time.perf_counter() - t)
else:
    import onnxruntime as ort
    o = ort.SessionOptions(); o.intra_op_num_threads = threads; o.inter_op_num_threads = 1
    s = ort.InferenceSession(bundle + "/" + artifact, sess_options=o, providers=["CPUExecutionProvider"])
    feeds = {s.get_inputs()[0].name: x.astype(np.float32)}
    names = [o.name for o in s.get_outputs()]
    for _ in range(warmup + 1):
        s.run(names, feeds)
    for _ in range(runs):
        t = time.perf_counter(); s.run(names, feeds); times.append(time.perf_counter() - t)
print(json.dumps({"p50": float(np.percentile(np.array(times) * 1000.0, 50))}))
"""


def device_python() -> tuple[str, str]:
    root = Path("/opt/edgetk-test/envs")
    for env in sorted(root.glob("device-*")) if root.is_dir() else []:
        if (env / ".complete").is_file() and (env / "bin" / "python").exists():
            return str(env / "bin" / "python"), f"the device env {env.name} (numpy + onnxruntime + ai-edge-litert)"
    return sys.executable, "the toolkit's own venv (no device env under /opt/edgetk-test/envs)"


def _bundle() -> Path:
    import os

    from benchmarks.convert import mobilenet_source
    from toolkit.conversion.pipeline import ConvertOptions, convert_bundle

    root = work_dir()
    built = root / "convert" / "mobilenetv2-toolkit"  # the convert section's bundle, when it has run
    if (built / "manifest.json").is_file():
        return built
    source, calibration, _ = mobilenet_source(root / "convert")
    os.environ["EDGETK_CACHE_DIR"] = str(root / "runner-cache")
    out = root / "runner" / "mobilenetv2"
    convert_bundle(ConvertOptions(source=str(source), target="generic-x86_64", calibration=calibration,
                                  precisions=("fp32", "int8"), formats=("tflite", "onnx"), out=out, force=True,
                                  threads=THREADS), progress=log)
    return out


def run() -> tuple[str, dict[str, Any]]:
    python, which = device_python()
    log("runner: building (or reusing) the MobileNetV2 bundle")
    bundle = _bundle()
    manifest = json.loads((bundle / "manifest.json").read_text())
    runner = bundle / manifest["runner"]["file"]
    rows = []
    ratios: dict[str, float] = {}
    for record in manifest["artifacts"]:
        if record["precision"] not in ("fp32", "int8"):
            continue
        file = record["file"]
        runner_p50: list[float] = []
        bare_p50: list[float] = []
        log(f"runner: {file}, {ROUNDS} alternating rounds")
        for _ in range(ROUNDS):
            out = subprocess.run([python, str(runner), "run-one", "--bundle", str(bundle), "--artifact", file,
                                  "--runs", str(RUNS), "--warmup", str(WARMUP), "--threads", str(THREADS),
                                  "--skip-verify"], capture_output=True, text=True, check=True)
            report = json.loads(out.stdout)
            report = report["reports"][0] if "reports" in report else report
            runner_p50.append(float(report["latency_ms"]["p50"]))
            out = subprocess.run([python, "-c", BARE, str(bundle), file, str(THREADS), str(RUNS), str(WARMUP)],
                                 capture_output=True, text=True, check=True)
            bare_p50.append(json.loads(out.stdout.strip().splitlines()[-1])["p50"])
        r, b = statistics.median(runner_p50), statistics.median(bare_p50)
        key = f"MobileNetV2 {record['precision']} {record['format']}"
        ratios[key] = r / b
        best = min(runner_p50) / min(bare_p50)
        ratios[key + " (fastest rounds)"] = best
        rows.append([key, f"{r:.3f}", f"{b:.3f}", f"{r / b:.3f}x", f"{best:.3f}x",
                     f"{min(runner_p50):.3f}-{max(runner_p50):.3f} / {min(bare_p50):.3f}-{max(bare_p50):.3f}",
                     f"{max(bare_p50) / min(bare_p50):.2f}x",
                     "yes" if abs(r / b - 1) <= 0.05 else "NO"])
    parts = [f"## {TITLE}", "",
             table(["artifact", "runner p50 ms", "bare loop p50 ms", "runner / bare (medians)",
                    "runner / bare (fastest rounds)", "range over rounds (runner / bare)",
                    "noise: bare loop max / min round",
                    "within 5%"], rows), "",
             (f"Python: {which}. {ROUNDS} alternating rounds per artifact, each a fresh process with {WARMUP} warm-up "
             f"and {RUNS} timed runs, {THREADS} threads; the table shows the median over rounds of each round's p50, and the ratio of the fastest round of each "
              "(the rounds least disturbed by other processes on this shared machine). 'within 5%' judges the "
              "medians. The noise column is the bare loop against itself: where one loop's p50 moves by more than "
              "5% from one round to the next, this machine cannot resolve a 5% difference, and a runner/bare "
              "ratio below 1 is noise too. By construction the two time the same call (TFLite: `invoke()` "
              "with the input already set; ONNX Runtime: `session.run` with the same options and 2 threads).")]
    return "\n".join(parts), {"ratios": ratios}
