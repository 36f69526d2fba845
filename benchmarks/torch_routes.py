"""Section ``torch_routes`` (issue 4): PyTorch -> ONNX (``torch.onnx.export`` + the shared ONNX quantization)
and PyTorch -> TFLite (litert-torch, when installed) through the toolkit, per precision, side by side with the
plain path a user writes: ``torch.onnx.export`` + ``quantize_dynamic``. Models: a small conv net and a
MobileNetV2-shaped net defined in ``benchmarks/torch_models.py`` (random weights, no torchvision)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import THREADS, log, mb, ms, ratio, table, timed_call, work_dir
from benchmarks.convert import Artifact, _plain, cosine, measure, toolkit_artifacts, toolkit_bundle

TITLE = "PyTorch routes (issue 4)"
MODELS = {"small conv net": ("small_convnet", (1, 3, 64, 64)), "MobileNet-like": ("mobilenet_like", (1, 3, 160, 160))}
CALIB = 64


def plain_export(factory: str, shape: tuple[int, ...], out: Path) -> Path:
    """What a user writes: ``torch.onnx.export(model, (x,), path)`` with the defaults of torch 2.13."""
    import torch

    from benchmarks import torch_models

    model = getattr(torch_models, factory)()
    with torch.no_grad():
        torch.onnx.export(model, (torch.zeros(shape),), str(out), input_names=["x"])
    return out


def run() -> tuple[str, dict[str, Any]]:

    root = work_dir() / "torch"
    root.mkdir(parents=True, exist_ok=True)
    has_litert_torch = importlib.util.find_spec("litert_torch") is not None
    parts = [f"## {TITLE}", ""]
    if not has_litert_torch:
        parts += ["litert-torch is not installed: the TFLite route is not measured (`pip install -e '.[all]'`).", ""]
    headline: dict[str, Any] = {"ratios": {}}
    factory_file = Path(__file__).with_name("torch_models.py")
    for label, (factory, shape) in MODELS.items():
        log(f"torch: {label}")
        rng = np.random.default_rng(0)
        samples = rng.standard_normal((CALIB, *shape[1:])).astype(np.float32)
        calibration = root / f"{factory}_calib.npz"
        np.savez(calibration, x=samples)
        source = f"{factory_file}:{factory}"
        artifacts: list[Artifact] = []
        times: list[list[str]] = []
        notes: list[str] = []
        bundle = root / f"{factory}-onnx"
        manifest, fresh, _cached, more = toolkit_bundle(source, calibration, bundle, formats=("onnx",),
                                                        cache_dir=root / "cache")
        notes += more
        artifacts += toolkit_artifacts(manifest, bundle)
        times.append(["toolkit ONNX route (fp32, fp16, dynamic, int8; verified, timed)", f"{fresh:.1f} s"])
        exporters = {note for record in manifest.artifacts for note in record.notes if "exported with" in note}
        notes += [f"ONNX artifacts: {note}" for note in sorted(exporters)]
        if has_litert_torch and (factory == "small_convnet" or os.environ.get("EDGETK_BENCH_FULL")):
            bundle_t = root / f"{factory}-tflite"
            manifest_t, fresh_t, _c, more = toolkit_bundle(source, calibration, bundle_t, formats=("tflite",),
                                                           cache_dir=root / "cache", precisions=("fp32", "int8"))
            notes += more
            artifacts += toolkit_artifacts(manifest_t, bundle_t)
            times.append(["toolkit TFLite route via litert-torch (fp32, int8 PT2E; verified, timed)",
                          f"{fresh_t:.1f} s"])
        plain_dir = root / f"{factory}-plain"
        shutil.rmtree(plain_dir, ignore_errors=True)
        plain_dir.mkdir(parents=True)
        art, seconds = _plain("plain torch.onnx.export fp32", "onnxruntime", "fp32",
                              lambda: plain_export(factory, shape, plain_dir / "model.onnx"))  # noqa: B023
        artifacts.append(art)
        times.append(["plain `torch.onnx.export`", f"{seconds:.1f} s"])
        if art.path is not None:
            fp32_path = art.path
            art2, seconds = _plain("plain quantize_dynamic", "onnxruntime", "dynamic",
                                   lambda: _quantize_dynamic(fp32_path, plain_dir / "dynamic.onnx"))  # noqa: B023
            artifacts.append(art2)
            times.append(["plain `quantize_dynamic`", "failed (see above)" if art2.error else f"{seconds:.1f} s"])
        results = measure(artifacts, samples[-6:], cosine, budget_s=30.0)
        rows = []
        ratios: dict[str, float] = {}
        for runtime in ("onnxruntime", "litert"):
            base = results.get(f"toolkit fp32|{runtime}", {}).get("median", float("nan"))
            base_size = next((_size(a.path) for a in artifacts if a.label == "toolkit fp32" and a.runtime == runtime),
                             0)
            for a in artifacts:
                if a.runtime != runtime:
                    continue
                r = results.get(f"{a.label}|{runtime}")
                size = _size(a.path)
                if r is None:
                    rows.append([runtime, a.label, mb(size) if size else "-", "-", "-", "-", "-", a.error])
                    continue
                fmt = "onnx" if runtime == "onnxruntime" else "tflite"
                key = f"{a.label} {fmt}" if a.who == "toolkit" else a.label
                ratios[key] = r["median"] / base
                rows.append([runtime, a.label, mb(size), ratio(size, base_size), ms(r["median"]),
                             ratio(r["median"], base), f"{r['quality']:.4f}", a.status or a.error])
        headline["ratios"][label] = ratios
        params = sum(int(np.prod(p.shape)) for p in _params(factory))
        parts += [f"### {label} (input {'x'.join(map(str, shape))}, {params / 1e6:.2f}M parameters)", "",
                  table(["runtime", "artifact", "size", "size vs fp32", "median ms", "latency vs fp32",
                         "cosine vs fp32", "toolkit status / error"], rows), "",
                  table(["conversion", "wall time"], times), ""]
        parts += [f"- {n}" for n in notes] + ([""] if notes else [])
    if has_litert_torch and not os.environ.get("EDGETK_BENCH_FULL"):
        parts.append("The litert-torch route of the MobileNet-like net is left out of the default run (its conversion "
                     "took 1-5 minutes here, depending on the load); `EDGETK_BENCH_FULL=1 scripts/bench torch_routes` "
                     "includes it. Measured once (2 threads, same machine): int8 0.29x the fp32 size, 0.68x its "
                     "LiteRT latency.\n")
    parts.append("The plain export's size includes the `.onnx.data` file `torch.onnx.export` writes beside the model "
                 "by default. ")
    parts.append(f"{THREADS} threads; latency interleaved per runtime (10 rounds); ratios against the toolkit's fp32 "
                 "artifact of the same runtime; cosine on 6 held-out random inputs against that artifact.")
    return "\n".join(parts), headline


def _size(path: Path | None) -> int:
    """Bytes of an ONNX model including the external-data file the current exporter writes beside it."""
    if path is None or not path.exists():
        return 0
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def _quantize_dynamic(fp32: Path, out: Path) -> Path:
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(str(fp32), str(out))
    return out


def _params(factory: str) -> list[Any]:
    from benchmarks import torch_models

    return list(getattr(torch_models, factory)().parameters())


__all__ = ["run", "timed_call"]
