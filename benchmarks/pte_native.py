"""Section ``pte_native`` (issue 35): one model's ``.pte`` checked on `local` by the device runner through the native
runner (toolkit/device_side/pte_runner.cpp: ExecuTorch's runtime libraries, no torch) and through ExecuTorch's
Python binding (which imports torch), beside the same model's TFLite and ONNX artifacts: load time, first
inference, p50 and peak RSS as the check reports them. Each runs in the device envs the tests use (device-side
venvs: tests/fixtures/device_envs.py), each artifact in its own process. Models: the digits CNN (8x8) and the
MobileNet-like net of ``benchmarks/torch_models.py`` (random weights: speed and memory only)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import THREADS, log, table, timed_call, work_dir

TITLE = "ExecuTorch without torch: the native .pte runner (issue 35)"
MODELS = {"digits CNN": ("digits_cnn", (1, 1, 8, 8)), "MobileNet-like": ("mobilenet_like", (1, 3, 160, 160))}
CALIB = 64
RUNS = "200"
ROUNDS = 3
FIGURES = ("import_ms", "load_ms", "first_inference_ms", "peak_rss_mb", "runner_peak_rss_mb")


def _median_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The first report with each figure (and the p50) replaced by its median over the rounds."""
    failed = [r for r in reports if r.get("error")]
    if failed:
        return failed[0]
    out = dict(reports[0])
    for key in FIGURES:
        values = [r[key] for r in reports if r.get(key) is not None]
        out[key] = float(np.median(values)) if values else None
    out["latency_ms"] = {"p50": float(np.median([r["latency_ms"]["p50"] for r in reports]))}
    return out


def _convert(factory: str, shape: tuple[int, ...], out: Path, formats: tuple[str, ...],
             precisions: tuple[str, ...]) -> Any:
    from toolkit.conversion.pipeline import ConvertOptions, convert_bundle
    from toolkit.delivery.bundle import read_bundle

    stamp = out.with_name(f"{out.name}.formats")
    wanted = " ".join((*formats, *precisions))
    if (out / "manifest.json").is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return read_bundle(out).manifest  # converted by an earlier run of this section: only the checks again
    calibration = out.with_name(f"{factory}_calib.npz")
    np.savez(calibration, x=np.random.default_rng(0).standard_normal((CALIB, *shape[1:])).astype(np.float32))
    options = ConvertOptions(source=f"{Path(__file__).with_name('torch_models.py')}:{factory}",
                             target="generic-x86_64", calibration=calibration, precisions=precisions,
                             formats=formats, out=out, force=True, threads=THREADS, use_cache=False)
    result, seconds = timed_call(lambda: convert_bundle(options, progress=log))
    log(f"pte_native: {factory} converted in {seconds:.0f} s")
    stamp.write_text(wanted)
    return result.manifest


def _check(python: Path, bundle: Path, artifacts: list[str]) -> dict[str, dict[str, Any]]:
    from toolkit.device_side import RUNNER_FILE, source_path

    argv = [str(python), str(source_path(RUNNER_FILE)), "check", "--bundle", str(bundle), "--runs", RUNS,
            "--warmup", "20", "--threads", str(THREADS), *(a for name in artifacts for a in ("--artifact", name))]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    doc = json.loads(proc.stdout)
    return {r["artifact"]: r for r in doc["reports"]}


def run() -> tuple[str, dict[str, Any]]:
    from tests.fixtures.device_envs import (DEVICE_REQUIREMENTS, EXECUTORCH_REQUIREMENTS, NATIVE_NO_DEPS,
                                            NATIVE_REQUIREMENTS, ensure_env, install_native_pte_runner)

    native = ensure_env("executorch-native", NATIVE_REQUIREMENTS, NATIVE_NO_DEPS)
    install_native_pte_runner(native.python)
    binding = ensure_env("executorch", EXECUTORCH_REQUIREMENTS)
    plain = ensure_env("device", DEVICE_REQUIREMENTS)
    root = work_dir() / "pte_native"
    root.mkdir(parents=True, exist_ok=True)
    parts = [f"## {TITLE}", ""]
    headline: dict[str, Any] = {}
    for label, (factory, shape) in MODELS.items():
        formats = ["pte", "onnx"]
        if importlib.util.find_spec("litert_torch") is not None and (
                factory == "digits_cnn" or os.environ.get("EDGETK_BENCH_FULL")):
            formats.append("tflite")  # litert-torch on the MobileNet-like net: minutes (torch_routes)
        full = factory == "digits_cnn" or bool(os.environ.get("EDGETK_BENCH_FULL"))
        precisions = ("fp32", "int8") if full else ("fp32",)  # MobileNet-like INT8 .pte: 13 min to convert
        bundle = root / factory
        manifest = _convert(factory, shape, bundle, tuple(formats), precisions)
        files = [a.file for a in manifest.artifacts]
        pte = [f for f in files if f.endswith(".pte")]
        rows: list[list[Any]] = []
        runs = [("native runner, no torch", native.python, pte), ("Python binding + torch", binding.python, pte),
                ("", plain.python, [f for f in files if not f.endswith(".pte")])]
        rounds: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for round_ in range(ROUNDS):  # the paths alternate, so a burst of load on this shared machine hits all
            for path, python, names in runs:
                log(f"pte_native: {label}: {path or 'tflite/onnx'} (round {round_ + 1})")
                for name, report in _check(python, bundle, names).items():
                    rounds.setdefault((path, name), []).append(report)
        for (path, name), measured in rounds.items():
            report = _median_report(measured)
            if report.get("error"):
                rows.append([name, path or report["runtime"].get("name"), "error", report["error"]["kind"],
                             "", "", "", ""])
                continue
            runtime = report["runtime"]["name"] + (f" ({path})" if path else "")
            rows.append([name, runtime, f"{report.get('import_ms') or 0:.0f}", f"{report['load_ms']:.2f}",
                         f"{report['first_inference_ms']:.3f}",
                         f"{report['latency_ms']['p50']:.4f}", f"{report['peak_rss_mb']:.1f}",
                         f"{report.get('runner_peak_rss_mb') or report['peak_rss_mb']:.1f}"])
            headline[f"{label} {name} {path or report['runtime']['name']}"] = {
                "load_ms": report["load_ms"], "p50_ms": report["latency_ms"]["p50"],
                "peak_rss_mb": report["peak_rss_mb"]}
        parts += [f"### {label} (input {'x'.join(map(str, shape))})", "",
                  table(["artifact", "runtime (path)", "import ms", "load ms", "first inference ms", "p50 ms",
                         "peak RSS MB (the model's process)", "peak RSS MB (the Python runner)"], rows), ""]
    parts.append(f"{THREADS} threads, {RUNS} timed runs after 20 warm-up, each artifact in its own process, numbers as "
                 f"the device runner reports them on `local`, medians of {ROUNDS} rounds in which the paths alternate. The native runner's peak RSS is its own process's (the "
                 "program and ExecuTorch's libraries); the Python runner that drives it (numpy, no torch) is the "
                 "last column. Through the Python binding the model's process is the Python one with torch "
                 "imported. Import: the runtime's Python import (with torch for the binding), for the native runner "
                 "its process start and library linking. Load: the program and its method loaded (native: mmap "
                 "data loader, timed inside the runner). The machine is "
                 "shared with other jobs this session: one run, side by side, not absolute times. The MobileNet-like "
                 "net's TFLite and INT8 artifacts only with `EDGETK_BENCH_FULL=1` (litert-torch and the INT8 .pte "
                 "take many minutes to convert here).")
    return "\n".join(parts), headline
