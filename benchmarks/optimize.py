"""Section ``optimize`` (issue 8): what each compression technique buys, measured by
``toolkit.optimization.optimize(...)`` on the real model (params, nonzero params, file and gzip size in the
source's own format, host latency in the source framework, accuracy), then prune + cluster + INT8 through the
convert stage (LiteRT artifact: size, gzip size, latency in LiteRT, accuracy).

Models: the digits CNN (Keras 3, 139k parameters, trained as the test suite trains it; fine-tuned 1 epoch after
each technique; accuracy on 497 held-out digits) and MobileNetV2 at 224x224 (random weights: no accuracy, no
fine-tuning).
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import THREADS, LiteRunner, interleaved, log, table, timed_call, work_dir

TITLE = "Optimize: compression techniques (issue 8)"

DIGITS_CASES: list[tuple[str, dict[str, Any]]] = [
    ("prune 50%", {"prune": 0.5}),
    ("prune 80%", {"prune": 0.8}),
    ("structured prune 50% of channels", {"prune": 0.5, "structured": True}),
    ("cluster 16", {"cluster": 16}),
    ("low-rank 90% energy", {"low_rank": 0.9}),
    ("prune 50% + cluster 16", {"prune": 0.5, "cluster": 16}),
]
MNV2_CASES: list[tuple[str, dict[str, Any]]] = [
    ("prune 50%", {"prune": 0.5}),
    ("structured prune 30% of channels", {"prune": 0.3, "structured": True}),
    ("cluster 16", {"cluster": 16}),
    ("low-rank 90% energy", {"low_rank": 0.9}),
    ("prune 50% + cluster 16", {"prune": 0.5, "cluster": 16}),
]
COMBINED = "prune 50% + cluster 16"


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB" if n < 10 * 1024 * 1024 else f"{n / 1e6:.2f} MB"


def _digits_data(root: Path) -> tuple[Path, Path, Path, Any]:
    from tests.fixtures.models import load_digits, train_digits_cnn

    digits = load_digits()
    model = train_digits_cnn(digits, root / "digits.keras", sequential=False)
    train = root / "digits_train.npz"
    evaluation = root / "digits_eval.npz"
    np.savez(train, image=digits.x_train, y=digits.y_train)
    np.savez(evaluation, image=digits.x_heldout, y=digits.y_heldout)
    calib = root / "digits_calib.npz"
    np.savez(calib, image=digits.x_calib)
    return model, train, evaluation, (calib, digits)


def _int8(source: Path, calibration: Path, out: Path, eval_data: Path | None) -> Path:
    from toolkit.conversion.pipeline import ConvertOptions, convert_bundle

    os.environ["EDGETK_CACHE_DIR"] = str(work_dir() / "optimize-cache")
    result = convert_bundle(ConvertOptions(source=str(source), target="generic-x86_64", calibration=calibration,
                                           eval_data=eval_data, precisions=("int8",), formats=("tflite",),
                                           out=out, force=True, threads=THREADS), progress=log)
    return out / result.manifest.artifacts[0].file


def _lite_accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    runner = LiteRunner(path, x[:1])
    it = runner.interpreter
    d_in, d_out = it.get_input_details()[0], it.get_output_details()[0]
    hits = 0
    for sample, label in zip(x, y):
        value = sample[None].astype(np.float32)
        scale, zero = d_in["quantization"]
        if scale and np.issubdtype(d_in["dtype"], np.integer):
            value = np.clip(np.round(value / scale + zero), -128, 127)
        it.set_tensor(d_in["index"], value.astype(d_in["dtype"]))
        it.invoke()
        hits += int(np.argmax(it.get_tensor(d_out["index"])) == label)
    return hits / len(y)


def _keras_interleaved(label: str, source: Path, pruned: Path, name: str, calibration: Path,
                       headline: dict[str, Any]) -> str:
    """The float and the structurally pruned ``.keras`` models timed interleaved in Keras (``tf.function``, one
    sample), so the latency the removed channels buy is not lost in the noise of one-after-another runs."""
    import keras
    import tensorflow as tf

    data = np.load(calibration)
    sample = tf.constant(data[data.files[0]][:1])
    calls = {}
    for key, path in (("float", source), (name, pruned)):
        net = keras.saving.load_model(path)
        fn = tf.function(lambda x, net=net: net(x, training=False))
        calls[key] = lambda fn=fn: fn(sample)
    log(f"optimize {label}: float vs {name}, Keras, interleaved")
    timed = interleaved(calls, rounds=10, per_round=10, warmup=2)
    ratio = timed[name].median / timed["float"].median
    headline[f"{label}: {name} Keras latency vs float (interleaved)"] = f"{ratio:.2f}x"
    return (f"Keras latency interleaved (10 rounds, `tf.function`, one sample): float {timed['float'].median:.3f} ms, "
            f"{name} {timed[name].median:.3f} ms ({ratio:.2f}x).")


def _section(label: str, source: Path, cases: list[tuple[str, dict[str, Any]]], root: Path, *,
             train: Path | None, evaluation: Path | None, calibration: Path, int8_eval: tuple[Any, Any] | None,
             epochs: int) -> tuple[list[str], dict[str, Any]]:
    from toolkit.errors import ToolkitError
    from toolkit.optimization import optimize

    rows: list[list[Any]] = []
    baseline = None
    outputs: dict[str, Path] = {}
    headline: dict[str, Any] = {}
    has_acc = evaluation is not None and train is not None

    def fig_row(name: str, f: Any, seconds: float | None, base: Any) -> list[Any]:
        return [name, f"{f.params:,}", f"{f.nonzero_params:,}", f"{f.macs / 1e6:.1f} M", _kb(f.file_bytes), _kb(f.gzip_bytes),
                f"{f.gzip_bytes / base.gzip_bytes:.2f}x", f"{f.latency_ms:.3f}", f"{f.latency_ms / base.latency_ms:.2f}x",
                "-" if f.accuracy is None else f"{f.accuracy:.3f}", "-" if seconds is None else f"{seconds:.0f} s"]

    for name, kwargs in cases:
        out = root / f"{label}-{name.replace(' ', '_').replace('%', '').replace('+', 'and')}.keras"
        log(f"optimize {label}: {name}")
        try:
            report, seconds = timed_call(
                lambda: optimize(source, out=out, train_data=train, eval_data=evaluation,  # noqa: B023 - called now
                                 epochs=epochs if train is not None else 0, **kwargs)  # noqa: B023
            )
        except ToolkitError as exc:
            rows.append([name, f"failed: {exc.message}"] + ["-"] * 9)
            continue
        except Exception as exc:  # noqa: BLE001 - a technique that crashes is a result to report
            rows.append([name, f"crashed: {type(exc).__name__}: {str(exc)[:120]}"] + ["-"] * 9)
            continue
        if baseline is None:
            baseline = report.baseline
            rows.insert(0, fig_row("baseline (float)", baseline, None, baseline))
        rows.append(fig_row(name, report.final, seconds, baseline))
        outputs[name] = out
        if name.startswith("structured"):
            headline[f"{label}: {name} params vs float"] = f"{report.final.params / baseline.params:.2f}x"
            headline[f"{label}: {name} MACs vs float"] = f"{report.final.macs / baseline.macs:.2f}x"
        if name == COMBINED:
            headline[f"{label}: {name} gzip size vs float"] = f"{report.final.gzip_bytes / baseline.gzip_bytes:.2f}x"
            if report.final.accuracy is not None and baseline.accuracy is not None:
                headline[f"{label}: {name} accuracy change"] = f"{report.final.accuracy - baseline.accuracy:+.3f}"
    structured = next((n for n, _ in cases if n.startswith("structured")), None)
    keras_pair = ""
    if structured is not None and structured in outputs:
        keras_pair = _keras_interleaved(label, source, outputs[structured], structured, calibration, headline)
    parts = [table(["technique", "params", "nonzero", "MACs", "file (.keras)", "gzip", "gzip vs float", "Keras ms",
                    "latency vs float", "accuracy" if has_acc else "accuracy (no labels)", "optimize() time"],
                   rows), ""]
    if keras_pair:
        parts += [keras_pair, ""]

    # INT8 through the convert stage: the float model and the combined one, timed in LiteRT side by side.
    int8_rows = []
    runners: dict[str, Any] = {}
    sample = None
    int8_sources = [("float -> INT8", source), (f"{COMBINED} -> INT8", outputs.get(COMBINED))]
    if structured is not None:
        int8_sources.append((f"{structured} -> INT8", outputs.get(structured)))
    for name, src in int8_sources:
        if src is None:
            continue
        log(f"optimize {label}: {name} (convert stage)")
        try:
            artifact = _int8(src, calibration, root / f"{label}-{name.split(' ')[0]}-int8", evaluation)
        except ToolkitError as exc:
            int8_rows.append([name, f"failed: {exc.message}", "-", "-", "-", "-"])
            continue
        data = artifact.read_bytes()
        acc = "-"
        if int8_eval is not None:
            acc = f"{_lite_accuracy(artifact, *int8_eval):.3f}"
        if sample is None:
            sample = np.load(calibration)[next(iter(np.load(calibration).files))][:1]
        runners[name] = (LiteRunner(artifact, sample), data, acc)
    if runners:
        timed = interleaved({k: v[0] for k, v in runners.items()}, rounds=10, per_round=20, warmup=3)
        base_gzip = baseline.gzip_bytes if baseline is not None else 0
        for name, (_, data, acc) in runners.items():
            gz = len(gzip.compress(data, compresslevel=9))
            int8_rows.append([name, _kb(len(data)), _kb(gz), f"{gz / base_gzip:.2f}x" if base_gzip else "-",
                              f"{timed[name].median:.3f}", acc])
            if name.startswith(COMBINED):
                headline[f"{label}: prune + cluster + INT8 gzip size vs float .keras"] = (
                    f"{gz / base_gzip:.2f}x" if base_gzip else "n/a")
            if structured is not None and name.startswith(structured) and "float -> INT8" in timed:
                headline[f"{label}: {structured} -> INT8 LiteRT latency vs float -> INT8"] = (
                    f"{timed[name].median / timed['float -> INT8'].median:.2f}x")
    if int8_rows:
        parts += [table(["INT8 artifact (LiteRT)", "file", "gzip", "gzip vs float .keras", "LiteRT ms (2 threads)",
                         "accuracy"], int8_rows), ""]
    return parts, headline


def run() -> tuple[str, dict[str, Any]]:
    root = work_dir() / "optimize"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    parts = [f"## {TITLE}", ""]
    headline: dict[str, Any] = {}

    model, train, evaluation, (calib, digits) = _digits_data(work_dir())
    body, more = _section("digits", model, DIGITS_CASES, root, train=train, evaluation=evaluation,
                          calibration=calib, int8_eval=(digits.x_heldout, digits.y_heldout), epochs=1)
    headline.update(more)
    parts += [("### Digits CNN (Keras 3, 139k parameters; each technique fine-tuned 1 epoch on 1,100 digits; "
              "accuracy on 497 held-out)"), "", *body]

    from benchmarks.convert import mobilenet_source

    source, calibration, samples = mobilenet_source(work_dir() / "convert")
    eval_path = root / "mnv2_eval.npz"
    np.savez(eval_path, x=samples[:4])
    body, more = _section("MobileNetV2", source, MNV2_CASES, root, train=None, evaluation=eval_path,
                          calibration=calibration, int8_eval=None, epochs=0)
    headline.update(more)
    parts += ["### MobileNetV2 (224x224, random weights; no labels, no fine-tuning)", "", *body]
    parts += [("Sizes: the model file in the source's format (`.keras`) and that file gzip-compressed at level 9 "
              "(what pruning and clustering buy on the wire: zeros and repeated values compress). Keras latency: "
              "`optimize()`'s own median per model, measured one model after another (not interleaved), so "
              "compare it loosely. INT8 rows: the convert stage's LiteRT artifacts, timed interleaved in LiteRT.")]
    return "\n".join(parts), {"headline": headline}
