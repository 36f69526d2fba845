"""Shared pieces of the benchmarks: interleaved timing, the machine description, markdown tables, and the
section markers of docs/benchmarks.md.

Timing rules (the machine is shared and noisy): variants that are compared run interleaved in rounds
(A, B, C, A, B, C, ...), each round a short burst of runs after its own warm-up, so drifting load hits every
variant alike; the figure reported is the median over every timed run, and comparisons are ratios of medians
measured in the same run.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
THREADS = 2
PACKAGES = ("tensorflow", "keras", "tf2onnx", "onnx", "onnxruntime", "ai-edge-litert", "torch", "litert-torch",
            "paramiko", "numpy")


def work_dir() -> Path:
    """Where the benchmarks keep models and bundles between runs (``EDGETK_BENCH_DIR``)."""
    path = Path(os.environ.get("EDGETK_BENCH_DIR", "/tmp/edgetk-bench"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- timing


@dataclass
class Timed:
    """All timed runs of one variant, in milliseconds."""

    name: str
    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def runs(self) -> int:
        return len(self.times)


def interleaved(
    variants: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 10,
    per_round: int = 10,
    warmup: int = 3,
    budget_s: float | None = None,
) -> dict[str, Timed]:
    """Time every variant in ``rounds`` rounds of ``per_round`` calls each, variants interleaved in every
    round (each round's burst preceded by ``warmup`` untimed calls). ``budget_s`` caps the total time: a slow
    variant then gets fewer runs per round (at least 2), never fewer rounds."""
    results = {name: Timed(name) for name in variants}
    for fn in variants.values():  # first call (allocation, lazy init) outside any round
        fn()
    per_variant: dict[str, int] = dict.fromkeys(variants, per_round)
    warm: dict[str, int] = dict.fromkeys(variants, warmup)
    if budget_s is not None:
        for name, fn in variants.items():
            begin = time.perf_counter()
            fn()
            one = max(time.perf_counter() - begin, 1e-6)
            share = budget_s / len(variants) / rounds
            per_variant[name] = max(2, min(per_round, int(share / one) - warmup))
            if per_variant[name] < per_round:  # a slow variant: one warm-up call per round is plenty
                warm[name] = min(warmup, 1)
    for _ in range(rounds):
        for name, fn in variants.items():
            for _w in range(warm[name]):
                fn()
            for _r in range(per_variant[name]):
                begin = time.perf_counter()
                fn()
                results[name].times.append((time.perf_counter() - begin) * 1000.0)
    return results


def timed_call(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()`` and its wall time in seconds."""
    begin = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - begin


# --------------------------------------------------------------------------------------------- runtimes


class OrtRunner:
    """A bare onnxruntime session on the CPU provider with fixed threads; ``__call__`` runs one inference."""

    def __init__(self, path: Path, feed: Mapping[str, Any], *, threads: int = THREADS) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # idle intra-op pools spin by default and steal the cores from whatever is timed next (findings.md 5)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        self.feed = {i.name: feed[i.name] if i.name in feed else next(iter(feed.values()))
                     for i in self.session.get_inputs()}

    def __call__(self) -> object:
        return self.session.run(None, self.feed)


class LiteRunner:
    """A bare ai-edge-litert interpreter with fixed threads; float feeds are quantized for integer inputs.
    ``__call__`` times ``invoke`` after setting the (already converted) input, as TFLite's benchmark does."""

    def __init__(self, path: Path, feed: Any, *, threads: int = THREADS) -> None:
        import numpy as np
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads)
        self.interpreter.allocate_tensors()
        detail = self.interpreter.get_input_details()[0]
        value = np.asarray(feed, dtype=np.float32)
        scale, zero = detail["quantization"]
        if np.issubdtype(detail["dtype"], np.integer) and scale:
            info = np.iinfo(detail["dtype"])
            value = np.clip(np.round(value / scale + zero), info.min, info.max)
        self.index = detail["index"]
        self.value = value.astype(detail["dtype"])

    def __call__(self) -> object:
        self.interpreter.set_tensor(self.index, self.value)
        self.interpreter.invoke()
        return None


# --------------------------------------------------------------------------------------------- machine


def machine() -> dict[str, str]:
    info: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    flags_line = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16"]
    info["CPU"] = model.group(1).strip() if model else platform.processor() or platform.machine()
    info["cores (os.cpu_count)"] = str(os.cpu_count())
    info["CPU flags that matter here"] = ", ".join(f for f in wanted if f in flags) or "none of " + ", ".join(wanted)
    mem = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE) if Path(
        "/proc/meminfo").exists() else None
    info["RAM"] = f"{int(mem.group(1)) / 1024 / 1024:.1f} GiB" if mem else "unknown"
    info["OS"] = f"{platform.system()} {platform.release()} ({platform.machine()})"
    info["Python"] = platform.python_version()
    versions = []
    for dist in PACKAGES:
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    info["packages"] = ", ".join(versions)
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    info["edge-toolkit commit"] = commit or "unknown"
    info["load average (1, 5, 15 min) when written"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return info


# --------------------------------------------------------------------------------------------- markdown


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def mb(n_bytes: float) -> str:
    return f"{n_bytes / 1e6:.2f} MB"


def ratio(value: float, base: float) -> str:
    if not base or math.isnan(value) or math.isnan(base):
        return "n/a"
    return f"{value / base:.2f}x"


def ms(value: float) -> str:
    return "n/a" if math.isnan(value) else (f"{value:.3f}" if value < 10 else f"{value:.1f}")


HEADER = """# Benchmarks

Generated by `scripts/bench` (`scripts/bench SECTION...` rewrites only those sections and their entries in
docs/benchmarks.json; runs of different sections merge). Every comparison is measured side by side in one run:
the variants compared are timed interleaved (A, B, A, B, ...) so that load from other processes on this shared
machine hits them alike, and the figures that matter are ratios of medians. Absolute milliseconds are noisy
here; ratios much less so. Threads are fixed at 2 unless a table says otherwise. Each section ends with the
CPU and the load average at its start and end; sections measured on different days may come from different
machines (the machine block below is the last run's).

Reproduce: `scripts/bench int8 convert_time loads deploy` (models, bundles and devices are built under
`$EDGETK_BENCH_DIR`, default /tmp/edgetk-bench, and reused by later runs: delete it to rebuild them;
`PYTHONHASHSEED=0` and fixed seeds make the models and data the same each time). `scripts/bench` alone runs
every section.
"""


def _machine_block(info: Mapping[str, str]) -> str:
    date = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    lines = [f"Machine (last written {date}):", ""]
    lines += [f"- {key}: {value}" for key, value in info.items()]
    return "\n".join(lines)


def _constant(value: str) -> Callable[[re.Match[str]], str]:
    return lambda _match: value


def update_doc(sections: Mapping[str, str], order: Sequence[str], *, doc: Path = DOC) -> None:
    """Rewrite the named sections (and the machine block) of the doc, keeping every other section."""
    text = doc.read_text() if doc.exists() else HEADER
    first = text.find("<!-- bench:")
    text = HEADER + "\n" + (text[first:] if first >= 0 else "")  # the header is generated too
    blocks = {"machine": _machine_block(machine()), **sections}
    for name in ["machine", *order]:
        if name not in blocks:
            continue
        start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
        body = f"{start}\n{blocks[name].strip()}\n{end}"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
        if pattern.search(text):
            text = pattern.sub(_constant(body), text)
        else:
            text = text.rstrip() + "\n\n" + body + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text.rstrip() + "\n")
