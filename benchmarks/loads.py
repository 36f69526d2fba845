"""Section ``loads`` (issue 17): what a user waits for before the first result, as the device runner measures it.

Per artifact of the MobileNetV2 bundle (fp32 and int8, TFLite and ONNX; the runner section's bundle): cold
(the file dropped from the page cache), warm and first-inference loads, and each load option before/after:
XNNPACK's weight cache for LiteRT (CompiledModel API), ONNX Runtime's on-device optimized model. Every load
is a fresh process (``edgetk_runner.py check --loads``: the runner's own measurement, the same one `edgetk
check --loads` runs on a device); the section repeats the whole check in ``ROUNDS`` rounds and reports the
median over rounds of each figure. Then the background-load pattern of docs/examples/background_load.py:
time to the first result with a blocking load after a 150 ms app start vs the load on a thread during it,
each pattern a fresh process, alternated in rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, THREADS, log, table, work_dir

TITLE = "Loads: cold, warm, first inference, load options and background loads (issue 17)"
ROUNDS = 5
APP_START_MS = 150.0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _f(value: float) -> str:
    return "n/a" if value != value else f"{value:.1f}"


def _check(python: str, runner: Path, bundle: Path) -> dict[str, Any]:
    cache = work_dir() / "loads-cache"  # the device-side caches (optimized models, weight caches) of this bench
    out = subprocess.run([python, str(runner), "check", "--bundle", str(bundle), "--loads", "--runs", "5",
                          "--warmup", "1", "--threads", str(THREADS), "--cache-dir", str(cache)],
                         capture_output=True, text=True, check=False, timeout=1800)
    lines = [line for line in out.stdout.strip().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"the runner printed no report (exit {out.returncode}): {out.stderr[-800:]}")
    return dict(json.loads(lines[-1]))


def _get(load: dict[str, Any] | None, key: str) -> float:
    value = (load or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else float("nan")


def loads(python: str, bundle: Path) -> tuple[list[list[Any]], list[list[Any]], dict[str, Any], list[str]]:
    manifest = json.loads((bundle / "manifest.json").read_text())
    runner = bundle / manifest["runner"]["file"]
    figures: dict[str, dict[str, list[float]]] = {}
    dropped: dict[str, set[str]] = {}
    for index in range(ROUNDS):
        log(f"loads: round {index + 1}/{ROUNDS} (runner check --loads, every load a fresh process)")
        doc = _check(python, runner, bundle)
        for report in doc.get("reports", []):
            data = report.get("loads")
            if not isinstance(data, dict):
                continue
            name = report["artifact"]
            got = figures.setdefault(name, {})
            for kind in ("cold", "warm"):
                for key in ("load_ms", "first_inference_ms"):
                    got.setdefault(f"{kind} {key}", []).append(_get(data.get(kind), key))
            page = (data.get("cold") or {}).get("page_cache") or {}
            dropped.setdefault(name, set()).add(str(page.get("dropped")))
            for option in data.get("options", []):
                if option.get("available") is False:
                    got.setdefault("option", []).append(float("nan"))
                    dropped.setdefault(name + " option", set()).add(option.get("note", "unavailable"))
                    continue
                for stage in ("before", "prepare", "after"):
                    for key in ("load_ms", "first_inference_ms"):
                        got.setdefault(f"{option['name']} {stage} {key}", []).append(_get(option.get(stage), key))
    load_rows, option_rows, headline, notes = [], [], {}, []
    for name, got in figures.items():
        med = {k: _median([v for v in values if v == v]) for k, values in got.items()}
        load_rows.append([name, _f(med["cold load_ms"]), _f(med["warm load_ms"]), _f(med["cold first_inference_ms"]),
                          _f(med["warm first_inference_ms"]), ", ".join(sorted(dropped.get(name, {"?"})))])
        for option in ("xnnpack_weight_cache", "ort_optimized_model"):
            if f"{option} after load_ms" not in med:
                continue
            before, after = med[f"{option} before load_ms"], med[f"{option} after load_ms"]
            first_b, first_a = med[f"{option} before first_inference_ms"], med[f"{option} after first_inference_ms"]
            option_rows.append([name, option, _f(before), _f(med[f"{option} prepare load_ms"]), _f(after),
                                f"{after / before:.2f}x" if before else "n/a", _f(first_b), _f(first_a),
                                f"{(after + first_a) / (before + first_b):.2f}x" if before + first_b else "n/a"])
            headline[f"{name}: {option}, load after/before"] = f"{after / before:.2f}x" if before else "n/a"
    for name, values in dropped.items():
        if name.endswith(" option"):
            notes.append(f"{name[:-len(' option')]}: {'; '.join(sorted(values))}")
    return load_rows, option_rows, headline, notes


def background(python: str, artifact: Path) -> dict[str, float]:
    example = REPO / "docs" / "examples" / "background_load.py"
    got: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for pattern in ("blocking", "background"):
            out = subprocess.run([python, str(example), str(artifact), "--pattern", pattern, "--app-start-ms",
                                  str(APP_START_MS)], capture_output=True, text=True, check=True, timeout=600)
            doc = json.loads(out.stdout.strip().splitlines()[-1])
            for key in ("time_to_first_result_ms", "app_ready_ms", "load_done_ms"):
                got.setdefault(f"{pattern} {key}", []).append(float(doc[key]))
    return {k: _median(v) for k, v in got.items()}


def run() -> tuple[str, dict[str, Any]]:
    from benchmarks.runner import _bundle, device_python

    python, which = device_python()
    log("loads: building (or reusing) the MobileNetV2 bundle")
    bundle = _bundle()
    load_before = " ".join(f"{v:.2f}" for v in os.getloadavg())
    load_rows, option_rows, headline, notes = loads(python, bundle)
    bg_rows = []
    for file in ("model.fp32.tflite", "model.fp32.onnx"):
        if not (bundle / file).is_file():
            continue
        log(f"loads: background vs blocking, {file}")
        b = background(python, bundle / file)
        blocking, bg = b["blocking time_to_first_result_ms"], b["background time_to_first_result_ms"]
        bg_rows.append([file, _f(blocking), _f(bg), f"{bg / blocking:.2f}x", _f(blocking - bg),
                        _f(b["blocking app_ready_ms"]), _f(b["background app_ready_ms"])])
        headline[f"{file}: background load, time to first result vs blocking"] = f"{bg / blocking:.2f}x"
    load_after = " ".join(f"{v:.2f}" for v in os.getloadavg())
    parts = [
        f"## {TITLE}", "",
        f"MobileNetV2 224x224 bundle (random weights, BatchNorm statistics from data), {THREADS} threads, Python: "
        f"{which}. Medians over {ROUNDS} rounds of `edgetk_runner.py check --loads`; every load a fresh "
        f"process. Load average {load_before} at the start, {load_after} at the end.", "",
        "### Cold, warm and the first inference after each (ms)", "",
        table(["artifact", "cold load", "warm load", "first inference after cold", "first inference after warm",
               "page cache dropped"], load_rows), "",
        "### Load options, before -> after (ms)", "",
        "XNNPACK weight cache: 'before' is LiteRT's CompiledModel API without the cache, 'prepare' the load that "
        "writes it, 'after' a load that maps it. ORT optimized model: 'before' the plain warm load, 'prepare' the "
        "load that writes the optimized graph, 'after' a load of it with graph optimizations off.", "",
        table(["artifact", "option", "load before", "prepare", "load after", "load after/before",
               "first inference before", "first inference after", "load + first inference after/before"],
              option_rows), "",
        *[f"- {n}" for n in notes], "",
        f"### Background load vs blocking (docs/examples/background_load.py, {APP_START_MS:g} ms app start)", "",
        table(["artifact", "blocking: time to first result", "background: time to first result",
               "background/blocking", "saved ms", "app ready (blocking)", "app ready (background)"], bg_rows), "",
        "The app start is Python work here (a busy loop), which competes with the runtime's import for the "
        "interpreter lock: an app start that waits on I/O (a camera, the network) overlaps better.",
    ]
    return "\n".join(parts), {"headline": headline}


if __name__ == "__main__":  # pragma: no cover
    print(run()[0])
