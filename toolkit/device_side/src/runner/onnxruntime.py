"""ONNX Runtime: the session model, providers and their options, the profiler's placement and per-operator
profile, the session options --loads measures.
"""
import json
import os
from typing import Any, Callable, Dict, List, Tuple  # noqa: F401
from .base import INSTALL_HINTS, RunnerError, timed_calls
from .environment import on_demand_file
from .loading import LOAD_ROUNDS, first_inference, median_entry, page_cache_state, run_options
from .measuring import in_manifest_order, prepare_input
from .models import (
    CPU_PROVIDER, DEFAULT_PROFILE_RUNS, Loader, Model, Tensor, artifact_cache_dir, import_numpy, open_model,
    placement_record, version_of,
)

# --- shipped from here (the lines above are for the host's type checker) ---

def _np_dtype(numpy, ort_type):
    # type: (Any, str) -> Any
    table = {
        "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
        "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16", "tensor(uint16)": "uint16",
        "tensor(int32)": "int32", "tensor(int64)": "int64", "tensor(bool)": "bool",
    }
    return numpy.dtype(table.get(ort_type, "float32"))


def select_providers(wanted, available, options=None):
    # type: (list, list, Any) -> tuple
    """The providers (and their options) an ONNX session is opened with: the artifact's ``wanted`` ones this
    onnxruntime has, in the manifest's order, then CPUExecutionProvider always last (the fallback for every
    node an accelerator does not take). Returns (providers, provider_options, missing); the options list runs
    parallel to the providers (``{}`` where the manifest gives none), as InferenceSession takes them.
    """
    options = options if isinstance(options, dict) else {}
    providers = []  # type: list
    for name in wanted:
        if name in available and name != "CPUExecutionProvider" and name not in providers:
            providers.append(name)
    providers.append("CPUExecutionProvider")
    provider_options = []  # type: list
    for name in providers:
        given = options.get(name)
        provider_options.append(
            dict((str(k), v if isinstance(v, str) else json.dumps(v)) for k, v in given.items())
            if isinstance(given, dict) else {}
        )
    missing = [p for p in wanted if p not in available]
    return providers, provider_options, missing


def apply_ort_tuning(ort, options, variant):
    # type: (Any, Any, str) -> None
    """Set the session option that load variant ``variant`` (see ORT_TUNINGS) measures."""
    if variant == "ort-env-allocators":
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))  # once per process: a fresh one
        options.add_session_config_entry("session.use_env_allocators", "1")
    elif variant == "ort-no-arena":
        options.enable_cpu_mem_arena = False
    elif variant == "ort-initializer-allocator":
        options.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
    elif variant == "ort-no-prepacking":
        options.add_session_config_entry("session.disable_prepacking", "1")
    else:
        raise RunnerError("usage", "Unknown ONNX Runtime load option {!r}.".format(variant))


class OnnxModel(Model):
    """One ONNX Runtime session. ``profile_prefix`` turns ORT's profiler on (a separate session from the timed
    one); ``optimized_out`` writes the graph-optimized model there while loading; ``optimization="disable"``
    loads an already optimized file without optimizing again; ``cache_dir`` holds TensorRT engines."""

    format = "onnx"

    def __init__(self, version, path, threads, wanted_providers, record, profile_prefix=None, optimized_out=None,
                 optimization=None, cache_dir=None, tuning=None):
        # type: (Any, str, int, list, dict, Any, Any, Any, Any, Any) -> None
        import onnxruntime as ort

        numpy = import_numpy()
        self.runtime = "onnxruntime"
        self.version = version
        available = list(ort.get_available_providers())
        providers, provider_options, missing = select_providers(
            wanted_providers, available, record.get("provider_options"))
        if cache_dir:
            provider_options = device_provider_options(providers, provider_options, cache_dir)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        if profile_prefix:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        if optimized_out:
            options.optimized_model_filepath = optimized_out
        if optimization == "disable":
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if tuning:
            apply_ort_tuning(ort, options, tuning)
        self.session = ort.InferenceSession(
            path, sess_options=options, providers=providers, provider_options=provider_options)
        self.extra = {
            "providers": list(self.session.get_providers()),
            "providers_missing": missing,
        }
        specs = {}  # type: dict
        for key in ("inputs", "outputs"):
            for spec in record.get(key) or []:
                if isinstance(spec, dict) and isinstance(spec.get("name"), str):
                    specs[spec["name"]] = spec.get("quantization") or {}
        self.inputs = [self._tensor(numpy, n, specs) for n in self.session.get_inputs()]
        self.outputs = [self._tensor(numpy, n, specs) for n in self.session.get_outputs()]
        self.output_names = [t.name for t in self.outputs]
        self.feeds = {}  # type: dict

    @staticmethod
    def _tensor(numpy, node, specs):
        # type: (Any, Any, dict) -> Tensor
        quant = specs.get(node.name) or {}
        scale = (quant.get("scale") or [0.0])[0]
        zero = (quant.get("zero_point") or [0])[0]
        shape = [d if isinstance(d, int) else -1 for d in node.shape]
        return Tensor(node.name, shape, _np_dtype(numpy, node.type), float(scale), int(zero), node.name)

    def dynamic_batch(self):
        # type: () -> bool
        return bool(self.inputs) and all(t.shape and t.shape[0] == -1 for t in self.inputs)

    def resize_batch(self, batch):
        # type: (int) -> None
        """ONNX Runtime takes any batch a dynamic dimension allows: nothing to do."""

    def set_inputs(self, pairs):
        # type: (list) -> None
        self.feeds = dict((t.key, a) for t, a in pairs)

    def invoke(self):
        # type: () -> list
        return self.session.run(self.output_names, self.feeds)

    def timed_loop(self, runs, min_time):
        # type: (int, float) -> list
        return timed_calls(self.session.run, (self.output_names, self.feeds), runs, min_time)


def parse_ort_profile(path, skip_runs):
    # type: (str, int) -> tuple
    """(nodes, runs, run_ms) from an ONNX Runtime profile file: per node {name, op_type, provider, us, calls} summed
    over the runs after the first ``skip_runs`` (warm-up), the number of runs kept and their wall times (ms)."""
    import bisect

    with open(path, "rb") as handle:
        events = json.loads(handle.read().decode("utf-8"))
    runs = sorted((int(e.get("ts", 0)), int(e.get("dur", 0))) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    starts = [r[0] for r in runs]
    nodes = {}  # type: dict
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        run = bisect.bisect_right(starts, int(event.get("ts", 0))) - 1
        if run < skip_runs:
            continue
        args = event.get("args") or {}
        node = name[: -len("_kernel_time")]
        entry = nodes.setdefault(node, {"name": node, "op_type": args.get("op_name"),
                                        "provider": args.get("provider"), "us": 0, "calls": 0})
        entry["us"] += int(event.get("dur", 0))
        entry["calls"] += 1
    kept = runs[skip_runs:]
    return list(nodes.values()), len(kept), [r[1] / 1000.0 for r in kept]


def ort_profile_summary(nodes, runs, intended, top):
    # type: (list, int, str, int) -> tuple
    """(placement, profile) from parsed ORT profile nodes: per op type and the top nodes by time per inference."""
    total_us = float(sum(n["us"] for n in nodes)) or 0.0
    per_run = float(max(runs, 1))
    on = [n for n in nodes if n["provider"] == intended]
    fallback = [n for n in nodes if n["provider"] != intended]
    share = (sum(n["us"] for n in on) / total_us) if total_us else None
    placement = placement_record(intended, len(nodes), len(on), share, [str(n["op_type"]) for n in fallback],
                                 "profile", None if nodes else "The profile held no node events.")
    by_type = {}  # type: dict
    for n in nodes:
        entry = by_type.setdefault(n["op_type"], {"op_type": n["op_type"], "nodes": 0, "us": 0, "on": {}})
        entry["nodes"] += 1
        entry["us"] += n["us"]
        entry["on"][n["provider"]] = entry["on"].get(n["provider"], 0) + 1
    types = []
    for entry in sorted(by_type.values(), key=lambda e: -e["us"]):
        types.append({"op_type": entry["op_type"], "nodes": entry["nodes"],
                      "time_ms": round(entry["us"] / per_run / 1000.0, 6),
                      "share": round(entry["us"] / total_us, 4) if total_us else None, "on": entry["on"]})
    ranked = sorted(nodes, key=lambda n: -n["us"])
    listed = [{"name": n["name"], "op_type": n["op_type"], "on": n["provider"],
               "time_ms": round(n["us"] / per_run / 1000.0, 6),
               "share": round(n["us"] / total_us, 4) if total_us else None} for n in ranked[:top]]
    profile = {
        "available": True,
        "note": None,
        "runs": runs,
        "total_ms": round(total_us / per_run / 1000.0, 6),
        "overhead": None,
        "by_op_type": types,
        "top_nodes": listed,
    }
    return placement, profile


PATH_OPTIONS = ("trt_engine_cache_path", "trt_timing_cache_path")


def device_provider_options(providers, provider_options, cache_dir):
    # type: (list, list, str) -> list
    """Provider options with relative cache paths (TensorRT engines) turned into directories on the device."""
    out = []
    for name, options in zip(providers, provider_options):
        options = dict(options)
        for key in PATH_OPTIONS:
            value = options.get(key)
            if isinstance(value, str) and value and not os.path.isabs(value):
                path = os.path.join(cache_dir, value)
                try:
                    os.makedirs(path, mode=0o700)
                except OSError:
                    pass
                options[key] = path
        out.append(options)
    return out


# ONNX Runtime session options measured by --loads, each against the default session in the same rounds:
# load variant -> (report name, what it does). OnnxModel applies them (``tuning``).
ORT_TUNINGS = (
    ("ort-env-allocators", "session.use_env_allocators",
     "One CPU arena allocator registered on the environment (ort.create_and_register_allocator) and shared by "
     "every session that sets session.use_env_allocators=1, instead of one arena per session."),
    ("ort-no-arena", "enable_cpu_mem_arena=False",
     "SessionOptions.enable_cpu_mem_arena = False: tensors come from plain malloc instead of a growing arena "
     "that keeps its peak."),
    ("ort-initializer-allocator", "session.use_device_allocator_for_initializers",
     "Initializers (the weights) allocated with the device allocator directly instead of through the arena."),
    ("ort-no-prepacking", "session.disable_prepacking",
     "session.disable_prepacking=1: weights are not pre-packed for the kernels at load (a faster load, maybe a "
     "slower run)."),
)


def ort_profile(model, path, record, threads, opts, intended, first, times, top):
    # type: (Any, str, dict, int, Any, str, list, list, int) -> tuple
    """Profile the artifact in a second, profiled ORT session (the timed session stays unprofiled)."""
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="edgetk-profile-")
    try:
        providers = [p for p in record.get("execution_providers") or [] if isinstance(p, str)]
        profiled = OnnxModel(model.version, path, threads, providers, record,
                             profile_prefix=os.path.join(directory, "ort"),
                             cache_dir=artifact_cache_dir(opts, record, make=False))
        profiled.set_inputs(first)
        profiled.invoke()  # the first run (lazy initialisation) is left out of the summary
        runs = getattr(opts, "profile_runs", DEFAULT_PROFILE_RUNS) if getattr(opts, "profile", False) else 1
        profiled_times = profiled.timed_loop(max(1, runs), 0.0)
        nodes, kept, _ = parse_ort_profile(profiled.session.end_profiling(), 1)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    placement, profile = ort_profile_summary(nodes, kept, intended, top)
    if profiled.extra.get("providers_missing"):
        placement["note"] = "Not available in this onnxruntime: {}; every node ran on {}.".format(
            ", ".join(profiled.extra["providers_missing"]), ", ".join(profiled.extra["providers"]))
    plain = sum(times) / len(times) * 1000.0 if times else None
    with_profiler = sum(profiled_times) / len(profiled_times) * 1000.0
    profile["overhead"] = {
        "profiled_mean_ms": round(with_profiler, 6),
        "unprofiled_mean_ms": round(plain, 6) if plain else None,
        "ratio": round(with_profiler / plain, 3) if plain else None,
    }
    return placement, profile


def measure_ort_tunings(one):
    # type: (Any) -> list
    """Each ONNX Runtime session option of ORT_TUNINGS against the default session: LOAD_ROUNDS rounds of fresh
    processes (default, then each option), medians of load, first inference and peak RSS per side."""
    runs = dict((v, []) for v in ["default"] + [v for v, _, _ in ORT_TUNINGS])  # type: dict
    for _ in range(LOAD_ROUNDS):
        for variant in runs:
            runs[variant].append(one("--load-variant", variant))
    before = median_entry(runs["default"])
    return [{"name": name, "before": before, "after": median_entry(runs[variant]), "note": note}
            for variant, name, note in ORT_TUNINGS]


class OnnxRuntimeLoader(Loader):
    """ONNX Runtime: one session with the artifact's execution providers this onnxruntime has, then the CPU."""

    load_variants = ("ort-optimized-write", "ort-optimized") + tuple(v for v, _, _ in ORT_TUNINGS)

    def prepare(self, record):
        # type: (Dict[str, Any]) -> Any
        import onnxruntime  # noqa: F401

    def open(self, prepared, version, path, record, threads, options):
        # type: (Any, Any, str, Dict[str, Any], int, Dict[str, Any]) -> Model
        providers = [p for p in record.get("execution_providers") or [] if isinstance(p, str)]
        return OnnxModel(version, path, threads, providers, record, **options)

    def missing_hint(self, forced):
        # type: (bool) -> str
        return INSTALL_HINTS[self.runtime] + " (on Jetson: NVIDIA's onnxruntime-gpu wheel for your JetPack)"

    def intended(self, record):
        # type: (Dict[str, Any]) -> str
        for name in record.get("execution_providers") or []:
            if isinstance(name, str):
                return name
        return CPU_PROVIDER

    def placement(self, model, path, record, threads, opts, intended, first, times, top):
        # type: (Any, str, Dict[str, Any], int, Any, str, list, List[float], int) -> Tuple[dict, Any]
        """From the profiler in a second session; a CPU-only artifact skips it without --profile (nothing can
        fall back from the CPU)."""
        if getattr(opts, "profile", False) or intended != CPU_PROVIDER:
            return ort_profile(model, path, record, threads, opts, intended, first, times, top)
        return placement_record(intended, None, None, None, [], "none",
                                "CPU provider only: nothing can fall back; node counts come with --profile."), None

    def workers(self, model, path, record, threads, level):
        # type: (Model, str, Dict[str, Any], int, int) -> List[Model]
        """One session shared: its run is thread-safe."""
        return [model] * level

    def measure_variant(self, variant, numpy, path, record, threads, opts, golden_inputs, out):
        # type: (str, Any, str, Dict[str, Any], int, Any, list, Dict[str, Any]) -> None
        """ort-optimized-write: the graph optimized while loading, written to the device cache; ort-optimized: that
        file loaded with optimizations off, its first outputs against the original's; an ORT_TUNINGS option."""
        optimized = os.path.join(artifact_cache_dir(opts, record), os.path.basename(path) + ".optimized.onnx")
        target = optimized if variant == "ort-optimized" else path
        if variant == "ort-optimized" and not os.path.isfile(optimized):
            raise RunnerError("usage", "No optimized model at {}: load with --load-variant ort-optimized-write "
                              "first.".format(optimized))
        page_cache_state(target, opts, out)
        options = run_options(opts, record)
        if variant == "ort-optimized-write":
            options["optimized_out"] = optimized
        elif variant == "ort-optimized":
            options["optimization"] = "disable"
        else:
            options["tuning"] = variant
        model = open_model(target, self.format, record, threads, opts.runtime, options)
        first, got = first_inference(numpy, model, record, golden_inputs, out)
        if variant == "ort-optimized":
            original = open_model(path, self.format, record, threads, opts.runtime, run_options(opts, record))
            original.set_inputs(first)
            want = original.invoke()
            out["max_abs_diff_vs_original"] = max(
                [float(numpy.max(numpy.abs(numpy.asarray(a, "float64") - numpy.asarray(b, "float64"))))
                 for a, b in zip(got, want) if numpy.asarray(a).size] or [0.0])

    def load_options(self, one, warm):
        # type: (Callable[..., Dict[str, Any]], Dict[str, Any]) -> List[Dict[str, Any]]
        prepare = one("--load-variant", "ort-optimized-write")
        after = one("--load-variant", "ort-optimized")
        return [{
            "name": "ort_optimized_model", "before": warm, "prepare": prepare, "after": after,
            "note": "The graph optimized once on this device (SessionOptions.optimized_model_filepath), then loaded "
                    "with graph optimizations off; valid for this device's onnxruntime and providers only."},
        ] + measure_ort_tunings(one)

    def layers(self, numpy, bundle, manifest, record, wanted, golden, samples, forced):
        # type: (Any, str, Dict[str, Any], Dict[str, Any], List[str], list, int, Any) -> Tuple[str, Dict[int, list]]
        """The tensors as outputs of ``layers/<artifact>.debug.onnx``, a copy of the artifact written at convert
        time with them added as graph outputs (the device needs no onnx package)."""
        values = dict((j, []) for j in range(len(wanted)))  # type: Dict[int, list]
        model = OnnxModel(version_of(self.runtime),
                          on_demand_file(bundle, manifest, "layers/{}.debug.onnx".format(record["file"])), 1, [],
                          record)
        known = set(o.name for o in model.session.get_outputs())
        present = [n for n in wanted if n in known]
        inputs = in_manifest_order(model.inputs, record.get("inputs"))
        for i in range(samples):
            model.set_inputs([(t, prepare_input(numpy, t, g[i])) for t, g in zip(inputs, golden)])
            got = dict(zip(present, model.session.run(present, model.feeds)))
            for j, n in enumerate(wanted):
                if n in got:
                    values[j].append(numpy.asarray(got[n], dtype=numpy.float32))
        return self.runtime, values
