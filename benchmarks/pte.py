"""Section ``pte`` (issue 25): the same PyTorch models as ExecuTorch ``.pte`` (XNNPACK delegate), TFLite
(litert-torch) and ONNX, fp32 and INT8, each built and verified by ``edgetk convert`` and timed side by side in one
process (every artifact interleaved in every round, through the toolkit's host sessions): latency per runtime,
the INT8 vs fp32 ratio of each runtime, and each route's conversion time. Models: the small conv net and the
MobileNet-like net of ``benchmarks/torch_models.py`` (random weights: speed only, accuracy is the tests')."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import THREADS, interleaved, log, mb, ms, ratio, table, timed_call, work_dir

TITLE = "ExecuTorch .pte vs TFLite and ONNX (issue 25)"
MODELS = {"small conv net": ("small_convnet", (1, 3, 64, 64)), "MobileNet-like": ("mobilenet_like", (1, 3, 160, 160))}
RUNTIMES = {"pte": "executorch", "tflite": "litert", "onnx": "onnxruntime"}
CALIB = 64


def _bundle(source: str, calibration: Path, out: Path, fmt: str) -> tuple[Any, float]:
    from toolkit.conversion.pipeline import ConvertOptions, convert_bundle

    options = ConvertOptions(source=source, target="generic-x86_64", calibration=calibration,
                             precisions=("fp32", "int8"), formats=(fmt,), out=out, force=True, threads=THREADS,
                             use_cache=False)
    result, seconds = timed_call(lambda: convert_bundle(options, progress=log))
    return result.manifest, seconds


def run() -> tuple[str, dict[str, Any]]:
    from toolkit.runtimes.execution import open_session

    root = work_dir() / "pte"
    root.mkdir(parents=True, exist_ok=True)
    formats = [f for f in RUNTIMES if f != "tflite" or importlib.util.find_spec("litert_torch") is not None]
    parts = [f"## {TITLE}", ""]
    headline: dict[str, Any] = {"int8_vs_fp32": {}, "vs_onnx_fp32": {}, "convert_s": {}}
    factory_file = Path(__file__).with_name("torch_models.py")
    for label, (factory, shape) in MODELS.items():
        if factory != "small_convnet" and not os.environ.get("EDGETK_BENCH_FULL") and "tflite" in formats:
            chosen = [f for f in formats if f != "tflite"]  # litert-torch on MobileNet: minutes (torch_routes)
        else:
            chosen = list(formats)
        log(f"pte: {label} ({', '.join(chosen)})")
        samples = np.random.default_rng(0).standard_normal((CALIB, *shape[1:])).astype(np.float32)
        calibration = root / f"{factory}_calib.npz"
        np.savez(calibration, x=samples)
        sessions: dict[str, Any] = {}
        sizes: dict[str, int] = {}
        conversion: list[list[str]] = []
        statuses: dict[str, str] = {}
        for fmt in chosen:
            out = root / f"{factory}-{fmt}"
            manifest, seconds = _bundle(f"{factory_file}:{factory}", calibration, out, fmt)
            conversion.append([fmt, f"{seconds:.1f} s"])
            headline["convert_s"][f"{label} {fmt}"] = round(seconds, 1)
            for record in manifest.artifacts:
                key = f"{fmt} {record.precision}"
                session = open_session(out / record.file, threads=THREADS)
                name = session.inputs[0].name
                feed = {name: samples[-1:]}
                sessions[key] = (session, feed)
                sizes[key] = record.bytes
                share = f", XNNPACK {record.pte.delegated_share:.0%} of nodes" if record.pte else ""
                statuses[key] = f"{record.status}{share}"
        log(f"timing {len(sessions)} artifacts interleaved")
        timed = interleaved({k: (lambda s=s, f=f: s.run(f)) for k, (s, f) in sessions.items()}, rounds=10,
                            per_round=10, warmup=2, budget_s=60.0)
        base = timed.get("onnx fp32")
        rows = []
        for key, result in timed.items():
            fmt, precision = key.split()
            fp32 = timed.get(f"{fmt} fp32")
            rows.append([RUNTIMES[fmt], key, mb(sizes[key]), ms(result.median),
                         ratio(result.median, fp32.median) if fp32 else "-",
                         ratio(result.median, base.median) if base else "-", statuses[key]])
            if precision == "int8" and fp32:
                headline["int8_vs_fp32"][f"{label} {RUNTIMES[fmt]}"] = round(result.median / fp32.median, 3)
            if base:
                headline["vs_onnx_fp32"][f"{label} {key}"] = round(result.median / base.median, 3)
        for session, _ in sessions.values():
            session.close()
        parts += [f"### {label} (input {'x'.join(map(str, shape))})", "",
                  table(["runtime", "artifact", "size", "median ms", "vs its fp32", "vs ONNX fp32", "status"], rows),
                  "", table(["route (fp32 + int8, verified, timed)", "conversion wall time"], conversion), ""]
    parts.append(f"{THREADS} threads; every artifact of a model interleaved in each of 10 rounds in one process, "
                 "through the toolkit's host sessions (ExecuTorch's Python runtime takes torch tensors: its call "
                 "includes the numpy -> torch wrap, a few microseconds). The machine is shared with other jobs this "
                 "session: ratios from one run, side by side, not absolute times. The litert-torch route of the "
                 "MobileNet-like net is left out unless `EDGETK_BENCH_FULL=1` (minutes to convert).")
    return "\n".join(parts), headline
