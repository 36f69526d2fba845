"""What a load is measured by, in the run and in each loader's own load variants: the load options, the page
cache before it, the first inference after it, and the median over fresh-process rounds.
"""
import time
from typing import Any, Dict  # noqa: F401
from .measuring import drop_from_page_cache, in_manifest_order, prepare_input, resident_fraction
from .models import artifact_cache_dir

# --- shipped from here (the lines above are for the host's type checker) ---

LOAD_ROUNDS = 3  # fresh processes per side for the session options, interleaved; medians are reported


def run_options(opts, record):
    # type: (Any, Dict[str, Any]) -> Dict[str, Any]
    """The load options of every model of this artifact, each loader reading the ones it knows: the device cache
    directory (ONNX Runtime keeps TensorRT engines there)."""
    return {"cache_dir": artifact_cache_dir(opts, record, make=False)}


def page_cache_state(path, opts, out):
    # type: (str, Any, Dict[str, Any]) -> None
    """Into ``out`` before a load: with --cold the file dropped from the page cache (and whether that worked),
    else how much of it is cached."""
    if getattr(opts, "cold", False):
        out["page_cache"] = drop_from_page_cache(path)
    else:
        out["resident_before_load"] = resident_fraction(path)


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
