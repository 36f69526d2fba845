"""One artifact measured in this process (run-one): load, first inference, timed runs, placement, profile,
throughput, and the loads (--loads) each in a fresh process.
"""
import argparse
import os
import traceback
from typing import Any, Dict, List  # noqa: F401
from .base import RunnerError
from .environment import artifact_format, default_threads, find_record, read_manifest, safe_name, verify_artifact
from .loading import first_inference, page_cache_state, run_options
from .measuring import compare_outputs, evict_from_page_cache, latency_samples, latency_stats, load_npz
from .memory import MEMORY_WORDS, out_of_memory, own_peak_rss_mb
from .models import (
    DEFAULT_PROFILE_TOP, LOADERS, Loader, Model, artifact_cache_dir, import_numpy, loader_named, open_model,
    placement_record,
)
from .throughput import measure_throughput
from .workers import empty_report, run_child

# --- shipped from here (the lines above are for the host's type checker) ---

# what --load-variant takes: each loader's own variants (Loader.measure_variant)
LOAD_VARIANTS = ("default",) + tuple(v for loader in LOADERS for v in loader.load_variants)


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


LOAD_KEYS = ("load_ms", "first_inference_ms", "import_ms", "page_cache", "resident_before_load", "cache_bytes",
             "max_abs_diff_vs_original", "peak_rss_mb", "error")


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
