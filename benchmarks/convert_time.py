"""Section ``convert_time`` (issue 13, speed): the wall time of ``edgetk convert`` with every recipe of the
generic-x86_64 profile verified, against the plain converter calls that produce the same artifacts without
verification (TFLiteConverter fp32 and full int8, tf2onnx fp32, onnxruntime ``quantize_static`` U8S8 QDQ
per-channel), each side a fresh process (imports included), alternated in ``ROUNDS`` rounds; the ratio of the
medians is the figure. A last ``edgetk convert`` under cProfile says where the toolkit's time goes.

The model is ``benchmarks.convert.mobilenet_source`` (random weights, BatchNorm statistics from data). Its INT8
artifacts miss the profile's accuracy tolerance (random weights are fragile under INT8), so the toolkit also
runs its selective-quantization retries, which the plain paths never do: the table splits that time out.
"""

from __future__ import annotations

import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, log, table, work_dir

TITLE = "Conversion wall time: `edgetk convert` vs the plain paths (issue 13)"
ROUNDS = 2
TARGET = 2.0

PLAIN = r"""
import sys, time
import numpy as np
import keras, tensorflow as tf, tf2onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
source, calibration, count, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
x = np.load(calibration)["x"][:count]
model = keras.saving.load_model(source)
steps = {}
def timed(name, fn):
    begin = time.perf_counter(); fn(); steps[name] = time.perf_counter() - begin
def tflite_fp32():
    open(out + "/fp32.tflite", "wb").write(tf.lite.TFLiteConverter.from_keras_model(model).convert())
def tflite_int8():
    c = tf.lite.TFLiteConverter.from_keras_model(model)
    c.optimizations = [tf.lite.Optimize.DEFAULT]
    c.representative_dataset = lambda: ([s[None]] for s in x)
    c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    c.inference_input_type = tf.int8
    c.inference_output_type = tf.int8
    open(out + "/int8.tflite", "wb").write(c.convert())
def onnx_fp32():
    spec = (tf.TensorSpec((1,) + x.shape[1:], tf.float32, name="input"),)
    proto, _ = tf2onnx.convert.from_function(tf.function(lambda t: model(t)), input_signature=spec, opset=17)
    open(out + "/fp32.onnx", "wb").write(proto.SerializeToString())
def onnx_int8():
    feeds = iter([{"input": s[None]} for s in x])
    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)
    quantize_static(out + "/fp32.onnx", out + "/int8.onnx", Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
for name, fn in (("TFLiteConverter fp32", tflite_fp32), ("TFLiteConverter full int8", tflite_int8),
                 ("tf2onnx fp32", onnx_fp32), ("quantize_static U8S8 QDQ per-channel", onnx_int8)):
    timed(name, fn)
import json
print(json.dumps(steps))
"""

# where the profiled toolkit run's time goes: label -> a pstats function pattern (cumulative seconds)
PROFILE_ROWS = (
    ("loading the source model (once per run)", r"detect\.py:\d+\(open_source\)"),
    ("the data read and the float reference outputs computed (once per run)", r"pipeline\.py:\d+\(_start\)"),
    ("every recipe built and verified (candidate.build_and_verify)", r"candidate\.py:\d+\(build_and_verify\)"),
    ("  of it: TFLiteConverter.convert calls", r"lite/python/lite\.py:\d+\(convert\)$"),
    ("  of it: TFLite calibration (FeedTensor)", r"calibrator\.py:\d+\(calibrate\)"),
    ("  of it: SavedModel loads by the TFLite converter", r"saved_model/load\.py:\d+\(load\)$"),
    ("  of it: onnxruntime quantize_static", r"quantization/quantize\.py:\d+\(quantize_static\)"),
    ("  of it: tf2onnx export", r"onnx/from_tf\.py:\d+\(export\)"),
    ("selective-quantization retries (all of it, incl. their conversions)", r"selective\.py:\d+\(selective\)"),
    ("layer-wise INT8 error tables", r"conversion/tables\.py:\d+\(table_for\)"),
)


def _edgetk(source: Path, calibration: Path, out: Path, cache: Path, *, profile: Path | None = None) -> tuple[
        float, str]:
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, EDGETK_CACHE_DIR=str(cache), TF_CPP_MIN_LOG_LEVEL="3")
    prefix = [sys.executable, "-m", "cProfile", "-o", str(profile)] if profile else [sys.executable]
    cmd = [*prefix, "-m", "toolkit.cli", "convert", str(source), "--target", "generic-x86_64", "--calibration",
           str(calibration), "--out", str(out), "--force"]
    begin = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=3600)
    seconds = time.perf_counter() - begin
    if proc.returncode != 0:
        raise RuntimeError(f"edgetk convert exited {proc.returncode}: {proc.stderr[-1500:]}")
    return seconds, proc.stdout + proc.stderr


def _plain(source: Path, calibration: Path, count: int, out: Path) -> tuple[float, dict[str, float]]:
    import json

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    begin = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PLAIN, str(source), str(calibration), str(count), str(out)],
                          capture_output=True, text=True, env=env, check=True, timeout=3600)
    seconds = time.perf_counter() - begin
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def _calibration_count(log_text: str) -> int:
    """How many samples the toolkit calibrated on (the rest of the calibration file is its held-out set): the
    plain paths get the same number."""
    match = re.search(r"calibration (\d+) samples", log_text)
    if not match:
        raise RuntimeError(f"edgetk convert did not say how many samples it calibrated on: {log_text[-800:]}")
    return int(match.group(1))


def _profile_rows(path: Path, total: float) -> list[list[str]]:
    stats = pstats.Stats(str(path))
    entries = stats.stats  # type: ignore[attr-defined]
    rows = []
    for label, pattern in PROFILE_ROWS:
        regex = re.compile(pattern)
        seconds = 0.0
        for (file, line, func), (_cc, _nc, _tt, cumulative, _callers) in entries.items():
            if regex.search(f"{file}:{line}({func})"):
                seconds = max(seconds, cumulative)  # the outermost call (recursive entries repeat it)
        rows.append([label, f"{seconds:.1f} s", f"{seconds / total:.0%}"])
    return rows


def run() -> tuple[str, dict[str, Any]]:
    from benchmarks.convert import mobilenet_source

    root = work_dir() / "convert_time"
    root.mkdir(parents=True, exist_ok=True)
    source, calibration, _ = mobilenet_source(work_dir() / "convert")
    load_before = " ".join(f"{v:.2f}" for v in os.getloadavg())
    toolkit_s: list[float] = []
    plain_s: list[float] = []
    steps: dict[str, list[float]] = {}
    retries = 0
    for index in range(ROUNDS):
        log(f"convert_time: round {index + 1}/{ROUNDS}: edgetk convert (fresh process, empty cache)")
        seconds, text = _edgetk(source, calibration, root / "bundle", root / "cache")
        toolkit_s.append(seconds)
        count = _calibration_count(text)
        retries = text.count("retrying ")
        log(f"convert_time: round {index + 1}/{ROUNDS}: plain paths (fresh process, {count} calibration samples)")
        seconds, got = _plain(source, calibration, count, root / "plain")
        plain_s.append(seconds)
        for name, value in got.items():
            steps.setdefault(name, []).append(value)
    log("convert_time: edgetk convert under cProfile (not counted in the ratio)")
    profile = root / "convert.prof"
    profiled_s, _ = _edgetk(source, calibration, root / "bundle", root / "cache", profile=profile)
    toolkit, plain = statistics.median(toolkit_s), statistics.median(plain_s)
    ratio = toolkit / plain
    rows = [["`edgetk convert` (4 recipes of generic-x86_64, each verified; fresh process, empty cache)",
             f"{toolkit:.1f} s", " / ".join(f"{v:.1f}" for v in toolkit_s)],
            ["plain paths, one fresh process (imports included)", f"{plain:.1f} s",
             " / ".join(f"{v:.1f}" for v in plain_s)]]
    rows += [[f"  plain: {name}", f"{statistics.median(v):.1f} s", " / ".join(f"{x:.1f}" for x in v)]
             for name, v in steps.items()]
    load_after = " ".join(f"{v:.2f}" for v in os.getloadavg())
    parts = [
        f"## {TITLE}", "",
        f"MobileNetV2 224x224 (random weights, BatchNorm statistics from data), {count} calibration samples on "
        f"both sides. **`edgetk convert` = {ratio:.2f}x the plain paths** (target <= {TARGET:g}x: "
        f"{'met' if ratio <= TARGET else 'NOT met'}). {ROUNDS} alternating rounds; load average {load_before} at "
        f"the start, {load_after} at the end.", "",
        table(["what", "median wall time", "each round"], rows), "",
        f"The toolkit's run included {retries} selective-quantization retr{'y' if retries == 1 else 'ies'} (its "
        "INT8 artifacts miss the tolerance on this random-weight model); the plain paths verify nothing and "
        "retry nothing.", "",
        f"### Where the toolkit's time goes (one more run under cProfile: {profiled_s:.0f} s, cumulative times)", "",
        table(["part", "cumulative", "of the profiled run"], _profile_rows(profile, profiled_s)),
    ]
    headline = {"ratio": ratio, "toolkit_s": toolkit, "plain_s": plain, "selective_retries": retries}
    return "\n".join(parts), headline


if __name__ == "__main__":  # pragma: no cover
    print(run()[0])
