"""One artifact measured in this process (run-one): load, first inference, timed runs, placement, profile,
throughput, and the loads (--loads) each in a fresh process.
"""
import argparse
import os
import time
import traceback
from typing import Any, Dict, List  # noqa: F401
from .base import RunnerError
from .check import find_record, run_child
from .environment import artifact_format, default_threads, read_manifest, safe_name, verify_artifact
from .loaders import LOADERS, loader_named
from .measuring import (
    compare_outputs, drop_from_page_cache, evict_from_page_cache, in_manifest_order, latency_samples,
    latency_stats, load_npz, own_peak_rss_mb, prepare_input, resident_fraction,
)
from .memory import MEMORY_WORDS, out_of_memory
from .models import (
    DEFAULT_PROFILE_TOP, Loader, Model, artifact_cache_dir, import_numpy, open_model, placement_record,
)
from .throughput import measure_throughput

# --- shipped from here (the lines above are for the host's type checker) ---

LOAD_ROUNDS = 3  # fresh processes per side for the session options, interleaved; medians are reported


# what --load-variant takes: each loader's own variants (Loader.measure_variant)
LOAD_VARIANTS = ("default",) + tuple(v for loader in LOADERS for v in loader.load_variants)


def run_options(opts, record):
    # type: (Any, Dict[str, Any]) -> Dict[str, Any]
    """The load options of every model of this artifact, each loader reading the ones it knows: the device cache
    directory (ONNX Runtime keeps TensorRT engines there)."""
    return {"cache_dir": artifact_cache_dir(opts, record, make=False)}


def _failure_note(what, exc):
    # type: (str, BaseException) -> dict
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return {"available": False, "error": "{} failed ({}: {})".format(what, type(exc).__name__, text)}


def inspect_artifact(numpy, model, path, record, threads, opts, first, times, golden_inputs, report):
    # type: (Any, Model, str, Dict[str, Any], int, Any, list, List[float], list, Dict[str, Any]) -> None
    """Placement (always), the per-operator profile (--profile) and throughput (--throughput), into ``report``.

    Each runs after the timed loop, so the latency percentiles and peak RSS stay those of the plain runs; a
    failure in one is reported in its own entry and leaves the measured report intact.
    """
    loader = model_loader(model)
    intended = loader.intended(record)
    top = getattr(opts, "profile_top", DEFAULT_PROFILE_TOP)
    try:
        placement, profile = loader.placement(model, path, record, threads, opts, intended, first, times, top)
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
                numpy, model, record, golden_inputs, opts,
                lambda level: loader.workers(model, path, record, threads, level))
        except Exception as exc:
            report["throughput"] = _failure_note("Measuring throughput", exc)


def model_loader(model):
    # type: (Model) -> Loader
    """The loader of the runtime that holds ``model``."""
    loader = loader_named(model.runtime)
    if loader is None:
        raise RunnerError("crash", "No loader for the runtime {!r}.".format(model.runtime))
    return loader


def page_cache_state(path, opts, out):
    # type: (str, Any, Dict[str, Any]) -> None
    """Into ``out`` before a load: with --cold the file dropped from the page cache (and whether that worked),
    else how much of it is cached."""
    if getattr(opts, "cold", False):
        out["page_cache"] = drop_from_page_cache(path)
    else:
        out["resident_before_load"] = resident_fraction(path)


def measure_load(numpy, path, fmt, record, threads, opts, golden_inputs):
    # type: (Any, str, str, Dict[str, Any], int, Any, list) -> Dict[str, Any]
    """One load and the first inference after it, in this (fresh) process: ``--cold`` drops the file from the page
    cache first and says whether that worked; ``--load-variant`` picks what is loaded (a loader's
    ``load_variants``, measured by it)."""
    variant = getattr(opts, "load_variant", None) or "default"
    artifact_cache_dir(opts, record)  # made here for every load: the variants keep their files in it
    out = {"load_variant": variant}  # type: Dict[str, Any]
    owners = [loader for loader in LOADERS if variant in loader.load_variants]
    if owners:
        if owners[0].format != fmt:
            raise RunnerError("usage", "--load-variant {} is a load option of {} (.{} artifacts); {} is not "
                              "one.".format(variant, owners[0].runtime, owners[0].format, os.path.basename(path)))
        owners[0].measure_variant(variant, numpy, path, record, threads, opts, golden_inputs, out)
        return out
    page_cache_state(path, opts, out)
    first_inference(numpy, open_model(path, fmt, record, threads, opts.runtime, run_options(opts, record)), record,
                    golden_inputs, out)
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


def measure_loads(bundle, name, opts, main_report):
    # type: (str, str, Any, Dict[str, Any]) -> Dict[str, Any]
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
    loader = loader_named(runtime)
    if loader is not None:
        loads["options"].extend(loader.load_options(one, loads["warm"]))
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
        model = open_model(path, fmt, record, threads, opts.runtime, run_options(opts, record))
        first, _ = first_inference(numpy, model, record, golden_inputs, report)
        if opts.warmup:
            model.timed_loop(opts.warmup, 0.0)
        times = model.timed_loop(opts.runs, opts.min_time)
        report["latency_ms"] = latency_stats(times)
        report["latency_samples_ms"] = latency_samples(times)
        report["runs"] = len(times)
        if golden_inputs:
            report["outputs_match"] = compare_outputs(numpy, model, bundle, manifest, record, golden_inputs)
        model_loader(model).own_checks(bundle, record, model, report)
        report["peak_rss_mb"] = own_peak_rss_mb()  # before profiling and throughput open sessions of their own
        elsewhere = model.peak_rss_mb()
        if elsewhere is not None:  # the program's own process (the native .pte runner), not this Python's
            report["runner_peak_rss_mb"] = report["peak_rss_mb"]
            report["peak_rss_mb"] = elsewhere
        inspect_artifact(numpy, model, path, record, threads, opts, first, times, golden_inputs, report)
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
