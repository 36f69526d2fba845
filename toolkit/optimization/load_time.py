"""Load time: what a cold start costs, and what shortens it (issue 8, "Load time"); docs/optimization.md has
the variants, why each, and the figures.

Everything is measured with the on-device runner itself (``edgetk_runner.py run-one --cold``), one fresh
process per measurement, the artifact's pages dropped from the page cache first: what a device sees after a
reboot. ``load_ms`` (file read/mapped + session or interpreter creation + allocation), ``first_inference_ms``
(lazy work lands here) and the steady ``latency_ms`` (a faster load is never bought with slower inference
unseen). The variants: ONNX graph optimizations saved offline at ``basic``/``extended`` (not ``all``: its
NCHWc layout transforms are for the host's CPU, not the device's), the ORT format, external data, TFLite
path (mmap) vs bytes, and the gzip size of each (what ``deploy --compress`` sends).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any  # Any: JSON values (runner reports, manifests), numpy dtypes of any kind

import numpy as np

from toolkit import device_side
from toolkit.delivery.deploy_wire import COMPRESS_LEVEL
from toolkit.errors import UsageError
from toolkit.optimization.onnx_variants import LEVELS, optimize_onnx, to_external_data

RUNNER = device_side.source_path(device_side.RUNNER_FILE)
DEFAULT_REPEATS = 5


@dataclass(frozen=True)
class LoadFigures:
    """One variant of a model, measured cold in ``repeats`` fresh processes (medians; ``load_ms_min`` is the
    best of them). ``outputs_match`` compares the variant's outputs on seeded random inputs with the original
    model's (host onnxruntime / LiteRT), within ``atol``."""

    variant: str
    file: str
    bytes: int
    gzip_bytes: int
    load_ms: float
    load_ms_min: float
    first_inference_ms: float
    latency_ms: float
    peak_rss_mb: float | None
    outputs_match: bool | None
    max_abs_error: float | None
    repeats: int
    how: str = "runner"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class LoadTimeReport:
    """The baseline row first, then every variant produced; ``python`` is the interpreter that measured."""

    model: str
    python: str
    rows: tuple[LoadFigures, ...] = field(default_factory=tuple)

    @property
    def baseline(self) -> LoadFigures:
        return self.rows[0]

    def to_dict(self) -> dict[str, object]:
        base = self.baseline
        return {
            "model": self.model,
            "python": self.python,
            "rows": [
                dict(r.to_dict(), load_ratio=_ratio(r.load_ms, base.load_ms),
                     cold_start_ms=round(r.load_ms + r.first_inference_ms, 3),
                     cold_start_ratio=_ratio(r.load_ms + r.first_inference_ms,
                                             base.load_ms + base.first_inference_ms))
                for r in self.rows
            ],
        }

    def table(self) -> str:
        head = (f"{'variant':<26}{'KB':>10}{'gzip KB':>10}{'load ms':>10}{'first ms':>10}{'cold ms':>10}"
                f"{'p50 ms':>9}{'same':>6}")
        lines = [head]
        for r in self.rows:
            same = "-" if r.outputs_match is None else ("yes" if r.outputs_match else "NO")
            lines.append(f"{r.variant:<26}{r.bytes / 1024:>10.1f}{r.gzip_bytes / 1024:>10.1f}{r.load_ms:>10.2f}"
                         f"{r.first_inference_ms:>10.2f}{r.load_ms + r.first_inference_ms:>10.2f}"
                         f"{r.latency_ms:>9.3f}{same:>6}")
        lines.append(f"cold: {self.baseline.repeats} fresh processes per row, file evicted from the page cache; "
                     f"measured with {self.python}")
        return "\n".join(lines)


def _ratio(a: float, b: float) -> float | None:
    return None if not b else round(a / b, 4)


# ------------------------------------------------------------------------------------------ producing


def gzip_bytes(path: str | os.PathLike[str], level: int = COMPRESS_LEVEL) -> int:
    """Size of ``path`` gzip-compressed at ``level`` (default: what deploy --compress uses)."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, 31)
    total = 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            total += len(compressor.compress(block))
    return total + len(compressor.flush())


# ------------------------------------------------------------------------------------------ measuring


def _reference(path: Path, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Seeded random inputs for ``path`` (an ONNX or TFLite model) and the outputs the host runtime gives."""
    rng = np.random.default_rng(seed)
    if path.suffix == ".tflite":
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=str(path))
        interpreter.allocate_tensors()
        inputs = [_random(rng, [int(d) for d in i["shape"]], np.dtype(i["dtype"]))
                  for i in interpreter.get_input_details()]
        for detail, array in zip(interpreter.get_input_details(), inputs):
            interpreter.set_tensor(detail["index"], array)
        interpreter.invoke()
        return inputs, [interpreter.get_tensor(o["index"]) for o in interpreter.get_output_details()]
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    types = {"tensor(float)": np.float32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float16)": np.float16}
    inputs = [_random(rng, [d if isinstance(d, int) else 1 for d in i.shape], np.dtype(types.get(i.type, np.float32)))
              for i in session.get_inputs()]
    outputs = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), inputs)})
    return inputs, [np.asarray(o) for o in outputs]


def _random(rng: np.random.Generator, shape: list[int], dtype: np.dtype[Any]) -> np.ndarray:
    if dtype.kind == "f":
        return rng.random(shape, dtype=np.float32).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, 0), min(info.max, 255), size=shape, endpoint=True).astype(dtype)


def _bundle_for(path: Path, folder: Path, reference: tuple[list[np.ndarray], list[np.ndarray]] | None,
                atol: float) -> Path:
    """A minimal bundle around one artifact (manifest + golden data) that the runner measures as it is."""
    from toolkit.delivery.bundle import save_npz, sha256_file

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    for extra in [path] + ([path.with_name(path.name + ".data")] if path.with_name(path.name + ".data").exists()
                           else []):
        dest = folder / extra.name
        try:
            os.link(extra, dest)
        except OSError:
            shutil.copyfile(extra, dest)
    record: dict[str, object] = {"file": target.name, "format": "tflite" if path.suffix == ".tflite" else "onnx",
                                 "sha256": sha256_file(target)}
    manifest: dict[str, object] = {"artifacts": [record]}
    if reference is not None:
        (folder / "golden").mkdir(exist_ok=True)
        save_npz(folder / "golden" / "inputs.npz", {f"input_{i}": a[None] for i, a in enumerate(reference[0])})
        save_npz(folder / "golden" / "outputs.npz", {f"output_{i}": a[None] for i, a in enumerate(reference[1])})
        manifest["golden_inputs"] = "golden/inputs.npz"
        record["golden"] = {"outputs": "golden/outputs.npz", "atol": atol}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def run_runner(python: str, bundle: Path, artifact: str, *, runs: int, cold: bool,
               threads: int | None = None, timeout: float = 300.0) -> dict[str, Any]:
    """One ``run-one`` of the runner in a fresh process; its JSON report (``error`` set when it failed)."""
    cmd = [python, str(RUNNER), "run-one", "--bundle", str(bundle), "--artifact", artifact, "--runs", str(runs),
           "--warmup", "1"]
    if cold:
        cmd.append("--cold")
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    raise UsageError(f"The runner ({python}) gave no report for {artifact} (exit {proc.returncode}).",
                     hint=(proc.stderr.strip().splitlines() or ["no output"])[-1][:300])


def measure_load(path: str | os.PathLike[str], *, variant: str | None = None, python: str | None = None,
                 repeats: int = DEFAULT_REPEATS, runs: int = 10, cold: bool = True, threads: int | None = None,
                 reference: tuple[list[np.ndarray], list[np.ndarray]] | None = None,
                 atol: float = 1e-4) -> LoadFigures:
    """Measure ``path`` with the runner, ``repeats`` fresh processes, each loading it cold.

    ``reference`` (inputs, outputs) makes the runner compare the variant's outputs with them (``atol``);
    ``python`` is the interpreter that runs the runner (a device env; default: this one).
    """
    if repeats < 1:
        raise UsageError("--repeats must be at least 1.")
    model = Path(path)
    python = python or sys.executable
    loads, firsts, p50s, rss = [], [], [], []
    match: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="edgetk-load-") as tmp:
        bundle = _bundle_for(model, Path(tmp) / "bundle", reference, atol)
        for _ in range(repeats):
            report = run_runner(python, bundle, model.name, runs=runs, cold=cold, threads=threads)
            if report.get("error"):
                error = report["error"]
                raise UsageError(f"The runner could not load {model.name}: {error.get('message')}",
                                 hint=error.get("hint"))
            loads.append(float(report["load_ms"]))
            firsts.append(float(report["first_inference_ms"]))
            p50s.append(float(report["latency_ms"]["p50"]))
            if report.get("peak_rss_mb") is not None:
                rss.append(float(report["peak_rss_mb"]))
            match = report.get("outputs_match") or match
    files = [model] + ([model.with_name(model.name + ".data")] if model.with_name(model.name + ".data").exists()
                       else [])
    return LoadFigures(
        variant=variant or model.name, file=str(model), bytes=sum(f.stat().st_size for f in files),
        gzip_bytes=sum(gzip_bytes(f) for f in files), load_ms=round(statistics.median(loads), 3),
        load_ms_min=round(min(loads), 3), first_inference_ms=round(statistics.median(firsts), 3),
        latency_ms=round(statistics.median(p50s), 4), peak_rss_mb=round(statistics.median(rss), 1) if rss else None,
        outputs_match=None if match is None else bool(match.get("ok")),
        max_abs_error=None if match is None else match.get("max_abs_error"), repeats=repeats,
    )


_TFLITE_SNIPPET = r"""
import json, os, sys, time
path, mode, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    from ai_edge_litert.interpreter import Interpreter
except ImportError:
    from tflite_runtime.interpreter import Interpreter
import numpy
fd = os.open(path, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
t0 = time.perf_counter()
if mode == "path":
    interpreter = Interpreter(model_path=path, num_threads=threads)
else:
    with open(path, "rb") as handle:
        interpreter = Interpreter(model_content=handle.read(), num_threads=threads)
interpreter.allocate_tensors()
t1 = time.perf_counter()
for d in interpreter.get_input_details():
    interpreter.set_tensor(d["index"], numpy.zeros(d["shape"], d["dtype"]))
interpreter.invoke()
t2 = time.perf_counter()
import resource
print(json.dumps({"load_ms": (t1 - t0) * 1e3, "first_inference_ms": (t2 - t1) * 1e3,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
"""


def tflite_rows(path: str | os.PathLike[str], *, python: str | None = None, repeats: int = DEFAULT_REPEATS,
                threads: int = 1) -> tuple[LoadFigures, LoadFigures]:
    """TFLite from a path (memory-mapped: what the runner does) vs from bytes read into Python, cold, each in
    fresh processes. Returns (path row, bytes row); ``how`` says they come from a small timing script."""
    model = Path(path)
    python = python or sys.executable
    rows = []
    for mode in ("path", "bytes"):
        docs = []
        for _ in range(repeats):
            proc = subprocess.run([python, "-c", _TFLITE_SNIPPET, str(model), mode, str(threads)],
                                  check=False, capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                raise UsageError(f"Loading {model.name} with LiteRT failed.",
                                 hint=(proc.stderr.strip().splitlines() or ["no output"])[-1][:300])
            docs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        size = model.stat().st_size
        rows.append(LoadFigures(
            variant=f"tflite from {'path (mmap)' if mode == 'path' else 'bytes'}", file=str(model), bytes=size,
            gzip_bytes=gzip_bytes(model), load_ms=round(statistics.median(d["load_ms"] for d in docs), 3),
            load_ms_min=round(min(d["load_ms"] for d in docs), 3),
            first_inference_ms=round(statistics.median(d["first_inference_ms"] for d in docs), 3), latency_ms=0.0,
            peak_rss_mb=round(statistics.median(d["rss_mb"] for d in docs), 1), outputs_match=None,
            max_abs_error=None, repeats=repeats, how="script"))
    return rows[0], rows[1]


def load_time_report(model: str | os.PathLike[str], *, out_dir: str | os.PathLike[str], python: str | None = None,
                     repeats: int = DEFAULT_REPEATS, levels: Sequence[str] = LEVELS, ort_format: bool = True,
                     external_data: bool = True, threads: int | None = None) -> LoadTimeReport:
    """Produce every load-time variant of ``model`` into ``out_dir`` and measure each against the original.

    ONNX: the original, offline ``basic``/``extended`` graphs, the ORT format (from ``extended``), external
    data. TFLite: the runner's load from the path, and the path vs bytes comparison (memory mapping).
    """
    source = Path(model)
    if not source.is_file():
        raise UsageError(f"The model {str(source)!r} does not exist.",
                         hint="Pass an .onnx or .tflite file (for example an artifact of a bundle).")
    if source.suffix not in (".onnx", ".tflite"):
        raise UsageError(f"--load-time measures .onnx and .tflite artifacts; {source.name!r} is neither.",
                         hint="Convert the model first (edgetk convert), then pass one of the bundle's artifacts.")
    for level in levels:
        if level not in LEVELS:
            optimize_onnx(source, Path(out_dir) / "x.onnx", level=level)  # raises the plain message
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    python = python or sys.executable
    reference = _reference(source)
    scale = max([float(np.max(np.abs(o.astype(np.float64)))) for o in reference[1] if o.size] + [1.0])
    atol = 1e-4 * scale

    def row(path: Path, variant: str) -> LoadFigures:
        return measure_load(path, variant=variant, python=python, repeats=repeats, reference=reference,
                            atol=atol, threads=threads)

    stem = source.name[: -len(source.suffix)]
    if source.suffix == ".tflite":
        base = row(source, "as built (runner, path)")
        by_path, by_bytes = tflite_rows(source, python=python, repeats=repeats, threads=threads or 1)
        return LoadTimeReport(model=str(source), python=python, rows=(base, by_path, by_bytes))
    rows = [row(source, "as built")]
    for level in levels:
        rows.append(row(optimize_onnx(source, out / f"{stem}.{level}.onnx", level=level), f"offline {level}"))
    if ort_format:
        rows.append(row(optimize_onnx(source, out / f"{stem}.ort", level="extended", ort_format=True),
                        "ORT format (extended)"))
    if external_data:
        rows.append(row(to_external_data(source, out / f"{stem}.external.onnx"), "external data"))
    return LoadTimeReport(model=str(source), python=python, rows=tuple(rows))

