"""One artifact measured in this process (run-one): load, first inference, timed runs, placement, profile,
throughput, and the loads (--loads) each in a fresh process.
"""
import argparse
import os
import time
import traceback
from typing import Any  # noqa: F401
from .base import RunnerError
from .check import find_record, run_child
from .environment import artifact_format, default_threads, read_manifest, safe_name, verify_artifact
from .executorch import pte_bundled_check, pte_placement, pte_profile
from .executorch_native import NativePteModel
from .litert import CompiledTFLite
from .measuring import (
    compare_outputs, drop_from_page_cache, evict_from_page_cache, in_manifest_order, latency_samples,
    latency_stats, load_npz, own_peak_rss_mb, prepare_input, resident_fraction,
)
from .memory import MEMORY_WORDS, out_of_memory
from .models import (
    CPU_PROVIDER, DEFAULT_PROFILE_TOP, artifact_cache_dir, import_numpy, open_model, placement_record,
)
from .onnxruntime import ORT_TUNINGS, measure_ort_tunings, onnx_session_options, ort_profile
from .tflite import intended_placement, tflite_graph_profile
from .throughput import measure_throughput

# --- shipped from here (the lines above are for the host's type checker) ---

LOAD_ROUNDS = 3  # fresh processes per side for the session options, interleaved; medians are reported


LOAD_VARIANTS = ("default", "ort-optimized-write", "ort-optimized", "litert-compiled", "xnnpack-cache") + tuple(
    v for v, _, _ in ORT_TUNINGS)


def _failure_note(what, exc):
    # type: (str, BaseException) -> dict
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return {"available": False, "error": "{} failed ({}: {})".format(what, type(exc).__name__, text)}


def inspect_artifact(numpy, model, path, fmt, record, threads, opts, first, times, golden_inputs, report):
    # type: (Any, Any, str, str, dict, int, Any, list, list, list, dict) -> None
    """Placement (always), the per-operator profile (--profile) and throughput (--throughput), into ``report``.

    Each runs after the timed loop, so the latency percentiles and peak RSS stay those of the plain runs; a
    failure in one is reported in its own entry and leaves the measured report intact.
    """
    intended = intended_placement(record, fmt)
    top = getattr(opts, "profile_top", DEFAULT_PROFILE_TOP)
    try:
        if fmt == "tflite":
            placement, profile = tflite_graph_profile(model.interpreter, intended, model.runtime, model.version, top)
        elif fmt == "pte":
            placement = pte_placement(record)
            profile = pte_profile(model, path, record, threads, first, top) if getattr(opts, "profile", False) \
                else None
        elif getattr(opts, "profile", False) or intended != CPU_PROVIDER:
            placement, profile = ort_profile(model, path, record, threads, opts, intended, first, times, top)
        else:
            placement = placement_record(intended, None, None, None, [], "none",
                                         "CPU provider only: nothing can fall back; node counts come with "
                                         "--profile.")
            profile = None
        report["placement"] = placement
        if getattr(opts, "profile", False):
            report["profile"] = profile
    except Exception as exc:
        report["placement"] = placement_record(intended, None, None, None, [], "none",
                                               _failure_note("Reading the placement", exc)["error"])
        if getattr(opts, "profile", False):
            report["profile"] = _failure_note("Profiling", exc)
    if getattr(opts, "throughput", False):
        try:
            report["throughput"] = measure_throughput(
                numpy, model, record, golden_inputs, opts, lambda level: _workers(model, path, record, threads,
                                                                                  opts, level))
        except Exception as exc:
            report["throughput"] = _failure_note("Measuring throughput", exc)


def _workers(model, path, record, threads, opts, level):
    # type: (Any, str, dict, int, Any, int) -> list
    """``level`` models for requests in flight: one ORT session is shared (its run is thread-safe); TFLite
    interpreters are not, so each request gets its own, with the threads split between them."""
    if model.format == "onnx":
        return [model] * level
    each = max(1, threads // level)
    workers = []
    for _ in range(level):
        workers.append(open_model(path, model.format, record, each, model.runtime))
    return workers


def measure_load(numpy, path, fmt, record, threads, opts, golden_inputs):
    # type: (Any, str, str, dict, int, Any, list) -> dict
    """One load and the first inference after it, in this (fresh) process: ``--cold`` drops the file from the page
    cache first and says whether that worked; ``--load-variant`` picks what is loaded (see LOAD_VARIANTS)."""
    variant = getattr(opts, "load_variant", None) or "default"
    cache = artifact_cache_dir(opts, record)
    base = os.path.basename(path)
    optimized = os.path.join(cache, base + ".optimized.onnx")
    weights = os.path.join(cache, base + ".xnnpack_cache")
    out = {"load_variant": variant}  # type: dict
    target = optimized if variant == "ort-optimized" else path
    if variant == "ort-optimized" and not os.path.isfile(optimized):
        raise RunnerError("usage", "No optimized model at {}: load with --load-variant ort-optimized-write "
                          "first.".format(optimized))
    if variant == "xnnpack-cache" and getattr(opts, "fresh_cache", False) and os.path.exists(weights):
        os.remove(weights)
    if getattr(opts, "cold", False):
        out["page_cache"] = drop_from_page_cache(target)
    else:
        out["resident_before_load"] = resident_fraction(target)
    onnx_options = onnx_session_options(opts, record, fmt)
    if variant == "ort-optimized-write":
        onnx_options = dict(onnx_options or {}, optimized_out=optimized)
    elif variant == "ort-optimized":
        onnx_options = dict(onnx_options or {}, optimization="disable")
    elif variant in [v for v, _, _ in ORT_TUNINGS]:
        if fmt != "onnx":
            raise RunnerError("usage", "--load-variant {} is an ONNX Runtime option; {} is not an ONNX "
                              "artifact.".format(variant, base))
        onnx_options = dict(onnx_options or {}, tuning=variant)
    if variant in ("litert-compiled", "xnnpack-cache"):
        model = CompiledTFLite(path, threads, weights if variant == "xnnpack-cache" else None)  # type: Any
    else:
        model = open_model(target, fmt, record, threads, opts.runtime, onnx_options)
    first, got = first_inference(numpy, model, record, golden_inputs, out)
    if variant == "xnnpack-cache":
        out["cache_bytes"] = os.path.getsize(weights) if os.path.isfile(weights) else None
    if variant == "ort-optimized":
        original = open_model(path, fmt, record, threads, opts.runtime, onnx_session_options(opts, record, fmt))
        original.set_inputs(first)
        want = original.invoke()
        out["max_abs_diff_vs_original"] = max(
            [float(numpy.max(numpy.abs(numpy.asarray(a, "float64") - numpy.asarray(b, "float64"))))
             for a, b in zip(got, want) if numpy.asarray(a).size] or [0.0])
    return out


def first_inference(numpy, model, record, golden_inputs, out):
    # type: (Any, Any, dict, Any, dict) -> tuple
    """Into ``out``: the model's runtime, its load and import times, and one timed inference on the first golden
    sample (zeros without one). Returns the inputs it fed and what the model returned."""
    out["runtime"] = dict({"name": model.runtime, "version": getattr(model, "version", None)}, **model.extra)
    out["load_ms"] = model.load_ms
    out["import_ms"] = model.import_ms
    inputs = in_manifest_order(model.inputs, record.get("inputs"))
    if golden_inputs and len(golden_inputs) == len(inputs):
        first = [(t, prepare_input(numpy, t, g[0])) for t, g in zip(inputs, golden_inputs)]
    else:
        first = [(t, prepare_input(numpy, t, numpy.zeros([d if d > 0 else 1 for d in t.shape], "float32")))
                 for t in inputs]
    model.set_inputs(first)
    t0 = time.perf_counter()
    got = model.invoke()
    out["first_inference_ms"] = round((time.perf_counter() - t0) * 1000.0, 3)
    return first, got


LOAD_KEYS = ("load_ms", "first_inference_ms", "import_ms", "page_cache", "resident_before_load", "cache_bytes",
             "max_abs_diff_vs_original", "peak_rss_mb", "error")


MEDIAN_KEYS = ("load_ms", "first_inference_ms", "import_ms", "peak_rss_mb")


def median_entry(entries):
    # type: (list) -> dict
    """The median and [min, max] of each of MEDIAN_KEYS over the rounds' entries (an error in any round is the
    entry's)."""
    failed = [e for e in entries if e.get("error")]
    if failed:
        return dict(failed[0])
    out = {"rounds": len(entries)}  # type: dict
    for key in MEDIAN_KEYS:
        values = sorted(e[key] for e in entries if isinstance(e.get(key), (int, float)))
        if values:
            middle = len(values) // 2
            out[key] = values[middle] if len(values) % 2 else round((values[middle - 1] + values[middle]) / 2.0, 3)
            out[key + "_range"] = [values[0], values[-1]]
    return out


def measure_loads(bundle, name, opts, main_report, fmt):
    # type: (str, str, Any, dict, str) -> dict
    """Cold, warm and with-each-load-option loads of one artifact, each in a fresh process (a load in the
    process that already loaded the artifact would find the runtime's own caches warm)."""

    def one(*args):
        # type: (*str) -> dict
        child = run_child(bundle, name, opts, extra=("--load-only",) + args)
        return dict((k, child.get(k)) for k in LOAD_KEYS if child.get(k) is not None or k == "error")

    runtime = (main_report.get("runtime") or {}).get("name")
    loads = {"cold": one("--cold"), "warm": one(), "options": [],
             "note": "Cold drops only the artifact's pages (posix_fadvise); the runtime's own libraries stay "
                     "cached, as they would for a second app on the device."}  # type: dict
    if fmt == "onnx":
        prepare = one("--load-variant", "ort-optimized-write")
        after = one("--load-variant", "ort-optimized")
        loads["options"].append({
            "name": "ort_optimized_model", "before": loads["warm"], "prepare": prepare, "after": after,
            "note": "The graph optimized once on this device (SessionOptions.optimized_model_filepath), then loaded "
                    "with graph optimizations off; valid for this device's onnxruntime and providers only."})
        loads["options"].extend(measure_ort_tunings(one))
    elif runtime == "litert":
        before = one("--load-variant", "litert-compiled")
        prepare = one("--load-variant", "xnnpack-cache", "--fresh-cache")
        after = one("--load-variant", "xnnpack-cache")
        loads["options"].append({
            "name": "xnnpack_weight_cache", "before": before, "prepare": prepare, "after": after,
            "note": "LiteRT's CompiledModel API with CpuOptions.xnnpack_weight_cache_path: the first load packs the "
                    "weights into the cache file, later loads map it instead of packing again."})
    else:
        loads["options"].append({
            "name": "xnnpack_weight_cache", "available": False,
            "note": "{}'s Interpreter API offers no XNNPACK weight cache (ai-edge-litert's CompiledModel API has "
                    "it).".format(runtime)})
    return loads


def empty_report(name, threads, runs, warmup):
    # type: (str, Any, int, int) -> dict
    return {
        "artifact": name,
        "runtime": {"name": None, "version": None},
        "threads": threads,
        "load_ms": None,
        "first_inference_ms": None,
        "latency_ms": None,
        "runs": 0,
        "warmup": warmup,
        "peak_rss_mb": None,
        "outputs_match": None,
        "error": None,
    }


def run_one(bundle, name, opts, verify=True):
    # type: (str, str, argparse.Namespace, bool) -> dict
    """Measure one artifact in this process and return its report (errors inside the report)."""
    report = empty_report(name, opts.threads, opts.runs, opts.warmup)
    try:
        manifest = read_manifest(bundle)
        record = find_record(manifest, name)
        threads = opts.threads or default_threads(manifest, record)
        report["threads"] = threads
        if verify:
            verify_artifact(bundle, record)
        fmt = artifact_format(record)
        numpy = import_numpy()
        golden_name = manifest.get("golden_inputs") or "golden/inputs.npz"
        golden_inputs = []  # type: list
        if safe_name(golden_name) and os.path.isfile(os.path.join(bundle, golden_name)):
            golden_inputs = load_npz(numpy, os.path.join(bundle, golden_name), "input_")
        path = os.path.join(bundle, name)
        if getattr(opts, "load_only", False):
            report.update(measure_load(numpy, path, fmt, record, threads, opts, golden_inputs))
            report["peak_rss_mb"] = own_peak_rss_mb()
            return report
        if getattr(opts, "cold", False):
            evict_from_page_cache(path)
        model = open_model(path, fmt, record, threads, opts.runtime, onnx_session_options(opts, record, fmt))
        first, _ = first_inference(numpy, model, record, golden_inputs, report)
        if opts.warmup:
            model.timed_loop(opts.warmup, 0.0)
        times = model.timed_loop(opts.runs, opts.min_time)
        report["latency_ms"] = latency_stats(times)
        report["latency_samples_ms"] = latency_samples(times)
        report["runs"] = len(times)
        if golden_inputs:
            report["outputs_match"] = compare_outputs(numpy, model, bundle, manifest, record, golden_inputs)
        if fmt == "pte":  # its own numbers, from its bundled program: a failure fails the outputs check too
            report["bundled_check"] = pte_bundled_check(bundle, record, model)
            if report["bundled_check"] and not report["bundled_check"]["ok"] and report.get("outputs_match"):
                report["outputs_match"]["ok"] = False
        report["peak_rss_mb"] = own_peak_rss_mb()  # before profiling and throughput open sessions of their own
        if isinstance(model, NativePteModel):  # the program's process, not this Python's
            report["runner_peak_rss_mb"] = report["peak_rss_mb"]
            report["peak_rss_mb"] = model.peak_rss_mb()
        inspect_artifact(numpy, model, path, fmt, record, threads, opts, first, times, golden_inputs, report)
    except RunnerError as exc:
        report["peak_rss_mb"] = own_peak_rss_mb()
        report["error"] = (out_of_memory(name, os.path.join(bundle, name), exc.message) if exc.kind == "out_of_memory"
                           else exc.to_dict())
    except MemoryError as exc:
        report["error"] = out_of_memory(name, os.path.join(bundle, name), "MemoryError{}".format(
            ": " + str(exc).splitlines()[0][:200] if str(exc) else ""))
    except Exception as exc:
        if MEMORY_WORDS.search(str(exc)):
            report["error"] = out_of_memory(name, os.path.join(bundle, name), "{}: {}".format(
                type(exc).__name__, str(exc).splitlines()[0][:200]))
            return report
        report["error"] = RunnerError(
            "crash",
            "Running {} failed ({}: {}).".format(name, type(exc).__name__, str(exc).splitlines()[0][:400]
                                                 if str(exc) else ""),
            "Run `python3 edgetk_runner.py run-one --bundle DIR --artifact {}` on the device to see the full "
            "error.".format(name),
            detail="".join(traceback.format_exc(limit=8))[-2000:],
        ).to_dict()
    return report
