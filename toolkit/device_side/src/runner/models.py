"""One loaded artifact, whatever runs it: the numpy import, Tensor, the load error classifier, the model opened
in the first runtime installed, the placement record and the device-side caches.
"""
import os
import re
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: F401
from .base import INSTALL_HINTS, PACKAGES, REDEPLOY_HINT, RunnerError
from .environment import dist_version
from .memory import MEMORY_WORDS, memory_line

# --- shipped from here (the lines above are for the host's type checker) ---

NUMPY_ABI = "compiled using NumPy 1.x cannot be run"


def import_numpy():
    try:
        import numpy
    except ImportError as exc:
        if MEMORY_WORDS.search(str(exc)):  # a shared library that cannot be mapped under ulimit -v
            raise RunnerError("out_of_memory", "importing numpy: {}".format(memory_line(str(exc))))
        raise RunnerError("missing_runtime", "numpy cannot be imported on this device ({}).".format(exc),
                          INSTALL_HINTS["numpy"])
    return numpy


def version_of(runtime):
    # type: (str) -> Any
    module, dists = PACKAGES[runtime]
    for dist in dists:
        version = dist_version(dist)
        if version:
            return version
    mod = sys.modules.get(module)
    return getattr(mod, "__version__", None) or "unknown"


def classify_load_error(exc, runtime, version):
    # type: (BaseException, str, Any) -> RunnerError
    """Turn what a runtime raised while loading an artifact into a kind + hint a person can act on."""
    text = str(exc).strip() or type(exc).__name__
    short = text.splitlines()[0][:400] if text else type(exc).__name__
    label = "{} {}".format(runtime, version or "")
    upgrade = INSTALL_HINTS.get(runtime, "") .replace("pip install", "pip install -U")
    if isinstance(exc, MemoryError) or MEMORY_WORDS.search(text):  # std::bad_alloc is no damaged file
        return RunnerError("out_of_memory", "{} could not allocate memory loading it ({})".format(
            label.strip(), short))
    match = re.search(r"Didn't find op for builtin opcode '(\w+)' version '(\d+)'", text)
    if match:
        return RunnerError(
            "unsupported_op",
            "{} has no kernel for {} version {} that this artifact uses ({}).".format(
                label.strip(), match.group(1), match.group(2), short),
            "This runtime is older than the converter that built the artifact. Install a newer one "
            "(pip install ai-edge-litert, or {}), or deploy an fp32/int8 artifact instead: dynamic-range "
            "artifacts from recent converters need recent runtimes.".format(upgrade),
        )
    match = re.search(r"unresolved custom op: ([\w./-]+?)\.?(?:Node|$|\s)", text) or re.search(
        r"custom op[: ]+'?([\w./-]+)", text, re.I)
    if match:
        return RunnerError(
            "unsupported_op",
            "The artifact uses the custom op {}, which {} does not provide ({}).".format(
                match.group(1), label.strip(), short),
            "Rebuild the model without custom ops (only TFLite builtin ops), or run it with a runtime that "
            "registers {}.".format(match.group(1)),
        )
    if re.search(r"builtin_code out of range|Op builtin_code|Unsupported builtin op|not supported by this "
                 r"interpreter|Unsupported model IR version|opset \d+ is under development|is not a registered "
                 r"function/op|Could not find an implementation|NOT_IMPLEMENTED|No Op registered|"
                 r"Unrecognized attribute", text, re.I):
        return RunnerError(
            "unsupported_op",
            "{} cannot run an operator of this artifact: {}".format(label.strip(), short),
            "Upgrade the runtime ({}), or convert with an older opset / fewer ops for this device.".format(upgrade),
        )
    if NUMPY_ABI in text or "_ARRAY_API not found" in text or "numpy.core.multiarray failed" in text:
        return RunnerError(
            "missing_runtime",
            "{} was built against numpy 1.x and cannot run with numpy {} ({}).".format(
                label.strip(), dist_version("numpy"), short),
            "pip install 'numpy<2' (tflite-runtime needs numpy 1.x), or pip install ai-edge-litert.",
        )
    if re.search(r"not a valid Flatbuffer|model identifier|Could not open|INVALID_PROTOBUF|Protobuf parsing "
                 r"failed|NO_SUCHFILE|NO_MODEL|Failed to load model|Invalid tensor|corrupt|truncated|"
                 r"Invalid model|Failed to verify|buffer too small|unexpected end", text, re.I):
        return RunnerError("corrupt_artifact", "{} cannot load the artifact: {}".format(label.strip(), short),
                           REDEPLOY_HINT)
    return RunnerError(
        "corrupt_artifact",
        "{} failed to load the artifact ({}: {}).".format(label.strip(), type(exc).__name__, short),
        "The file may be damaged or built for another runtime. " + REDEPLOY_HINT,
    )


class Tensor(object):
    """One input or output as the runtime sees it, with its affine quantization when it is an integer."""

    def __init__(self, name, shape, dtype, scale, zero_point, key, signature=None):
        # type: (str, list, Any, float, int, Any, Any) -> None
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.scale = scale
        self.zero_point = zero_point
        self.key = key  # interpreter tensor index or ORT name
        self.signature = signature if signature is not None else shape  # -1 where a dimension is dynamic

    @property
    def quantized(self):
        # type: () -> bool
        return bool(self.scale) and self.dtype.kind in "iu"


class Model(object):
    """One loaded artifact as the measuring code sees it, whichever runtime holds it (each runtime's block
    subclasses it): its tensors, inputs set once, one run, a timed loop of runs."""

    format = ""  # what it runs: tflite, onnx, pte
    runtime = ""  # its loader's runtime (RUNTIME_ROWS' name)
    version = None  # type: Any
    inputs = []  # type: List[Tensor]
    outputs = []  # type: List[Tensor]
    extra = {}  # type: Dict[str, Any]  # more about the runtime for the report's ``runtime`` (providers, path)
    import_ms = 0.0
    load_ms = 0.0
    own_load_ms = None  # type: Optional[float]  # the load the runtime timed itself, where it does (native .pte)

    def dynamic_batch(self):
        # type: () -> bool
        """Whether every input takes any batch (--throughput then measures batch sizes)."""
        return False

    def resize_batch(self, batch):
        # type: (int) -> None
        """Make every input's batch ``batch`` (only called where dynamic_batch is true)."""

    def set_inputs(self, pairs):
        # type: (List[Tuple[Tensor, Any]]) -> None
        """``pairs``: [(Tensor, array)] in any order; kept for every later run."""
        raise NotImplementedError

    def invoke(self):
        # type: () -> List[Any]
        """One run on the inputs set; its outputs as numpy arrays."""
        raise NotImplementedError

    def timed_loop(self, runs, min_time):
        # type: (int, float) -> List[float]
        """Seconds of each of ``runs`` runs (more until ``min_time`` seconds have passed)."""
        raise NotImplementedError

    def peak_rss_mb(self):
        # type: () -> Optional[float]
        """The peak RSS of the process that ran the model when that is not this one, else None."""
        return None


class Loader(object):
    """One runtime, as the runner uses it: each runtime's block subclasses it and LOADERS (filled by the loaders
    block) holds one per row of RUNTIME_ROWS. What differs between runtimes and formats lives in these methods, so the
    measuring code never asks which runtime or format it holds."""

    shares_import = False  # run-group imports it once for all the format's artifacts (torch behind ExecuTorch)
    load_variants = ()  # type: Tuple[str, ...]  # the --load-variant names measure_variant measures

    def __init__(self, row):
        # type: (Dict[str, Any]) -> None
        self.runtime = row["runtime"]  # type: str
        self.format = row["format"]  # type: str

    def prepare(self, record):
        # type: (Dict[str, Any]) -> Any
        """Import the runtime (ImportError when it is not installed here; part of ``import_ms``): what ``open``
        needs of it. A RunnerError refuses the artifact before anything loads (ExecuTorch's version lock)."""
        raise NotImplementedError

    def open(self, prepared, version, path, record, threads, options):
        # type: (Any, Any, str, Dict[str, Any], int, Dict[str, Any]) -> Model
        """Load the artifact (``load_ms``). ``options``: the run's load options (run_options), each loader
        reading the ones it knows."""
        raise NotImplementedError

    def missing_hint(self, forced):
        # type: (bool) -> str
        """The hint when no runtime for the format is installed (``forced``: --runtime named this one)."""
        return INSTALL_HINTS[self.runtime]

    def intended(self, record):
        # type: (Dict[str, Any]) -> str
        """Where the artifact is meant to run: a delegate (edgetpu, a library name), XNNPACK, an ORT provider."""
        return XNNPACK

    def placement(self, model, path, record, threads, opts, intended, first, times, top):
        # type: (Any, str, Dict[str, Any], int, Any, str, list, List[float], int) -> Tuple[dict, Any]
        """(placement, profile or None): where the artifact's nodes ran and, with --profile, per operator."""
        raise NotImplementedError

    def workers(self, model, path, record, threads, level):
        # type: (Model, str, Dict[str, Any], int, int) -> List[Model]
        """``level`` models for requests in flight: by default one each (a model is not thread-safe), the
        threads split between them."""
        each = max(1, threads // level)
        return [open_model(path, self.format, record, each, self.runtime) for _ in range(level)]

    def own_checks(self, bundle, record, model, report):
        # type: (str, Dict[str, Any], Model, Dict[str, Any]) -> None
        """The runtime's own check of the artifact's numbers, into ``report`` (ExecuTorch's bundled program)."""

    def import_once(self):
        # type: () -> None
        """What run-group imports once before forking (only where ``shares_import``)."""

    def measure_variant(self, variant, numpy, path, record, threads, opts, golden_inputs, out):
        # type: (str, Any, str, Dict[str, Any], int, Any, list, Dict[str, Any]) -> None
        """One of ``load_variants`` loaded in this fresh process, into ``out`` (measure_load)."""
        raise RunnerError("usage", "{} has no load variant {}.".format(self.runtime, variant))

    def load_options(self, one, warm):
        # type: (Callable[..., Dict[str, Any]], Dict[str, Any]) -> List[Dict[str, Any]]
        """--loads' ``options`` entries: each load option of this runtime before/after, ``one(*args)`` measuring a
        load in a fresh process (``warm``: the plain warm load)."""
        return []

    def layers(self, numpy, bundle, manifest, record, wanted, golden, samples, forced):
        # type: (Any, str, Dict[str, Any], Dict[str, Any], List[str], list, int, Any) -> Tuple[str, Dict[int, list]]
        """(runtime, {j: [float32 array per sample]}) of the ``wanted`` intermediate tensors (``layers``)."""
        raise RunnerError("usage", "Reading the layers of a .{} artifact is not supported.".format(self.format))


# The loader table, one per row of RUNTIME_ROWS in its order. This block owns it so that it and the blocks above
# the loaders can ask it; the loaders block (runner/loaders.py), inlined after every loader, fills it.
LOADERS = []  # type: List[Loader]


def loaders_for(fmt):
    # type: (str) -> Tuple[Loader, ...]
    """The loaders of the runtimes that run ``fmt``, in the order they are tried."""
    return tuple(loader for loader in LOADERS if loader.format == fmt)


def loader_named(runtime):
    # type: (Any) -> Optional[Loader]
    """The loader of the runtime named ``runtime``, None for another name (or none)."""
    for loader in LOADERS:
        if loader.runtime == runtime:
            return loader
    return None


def open_model(path, fmt, record, threads, forced, options=None):
    # type: (str, str, Dict[str, Any], int, Any, Any) -> Model
    """Load the artifact with the first of the format's loaders whose runtime is installed (or the forced one);
    classify failures. ``options`` go to the loader (ONNX Runtime: profiling, caches; see run_options)."""
    candidates = loaders_for(fmt)
    names = [loader.runtime for loader in candidates]
    if forced:
        if forced not in names:
            raise RunnerError("usage", "--runtime {} cannot run a .{} artifact (use one of: {}).".format(
                forced, fmt, ", ".join(names)))
        candidates = tuple(loader for loader in candidates if loader.runtime == forced)
    import_numpy()
    missing = []
    for loader in candidates:
        runtime = loader.runtime
        t0 = time.perf_counter()
        try:
            prepared = loader.prepare(record)
        except ImportError as exc:
            if NUMPY_ABI in str(exc) or MEMORY_WORDS.search(str(exc)):
                raise classify_load_error(exc, runtime, version_of(runtime))
            missing.append("{} ({})".format(runtime, str(exc).splitlines()[0] if str(exc) else "not installed"))
            continue
        version = version_of(runtime)
        t1 = time.perf_counter()
        try:
            model = loader.open(prepared, version, path, record, threads, options or {})
            model.import_ms = round((t1 - t0) * 1000.0, 3)
            model.load_ms = round((time.perf_counter() - t1) * 1000.0, 3)
            if model.own_load_ms is not None:  # the rest (a process started, libraries linked) counts as the import
                model.import_ms = round(model.import_ms + model.load_ms - model.own_load_ms, 3)
                model.load_ms = round(model.own_load_ms, 3)
            return model
        except (KeyboardInterrupt, RunnerError):  # RunnerError: the loader's own, kind decided
            raise
        except Exception as exc:  # MemoryError too: classify_load_error names it
            raise classify_load_error(exc, runtime, version)
    raise RunnerError(
        "missing_runtime",
        "No runtime for .{} artifacts is installed on this device (tried: {}).".format(fmt, "; ".join(missing)),
        candidates[0].missing_hint(bool(forced)),
    )


XNNPACK = "XNNPACK"


CPU_PROVIDER = "CPUExecutionProvider"


def placement_record(intended, total, on, share, fallback_ops, source, note):
    # type: (str, Any, Any, Any, list, str, Any) -> dict
    """The placement shape the host's gates read (docs/runner.md): keep these keys stable."""
    ops = sorted(set(fallback_ops))
    return {
        "intended": intended,
        "nodes_total": total,
        "nodes_on_intended": on,
        "time_share_on_intended": None if share is None else round(share, 4),
        "fallback_ops": ops,
        "fell_back": bool(total is not None and on is not None and on < total),
        "source": source,
        "note": note,
    }


def cache_root(opts):
    # type: (Any) -> str
    """Where the runner keeps files it makes on the device (TensorRT engines, optimized models, weight caches):
    --cache-dir, $EDGETK_CACHE_DIR, else ``cache`` in the toolkit's home (:func:`toolkit_home`)."""
    root = getattr(opts, "cache_dir", None) or os.environ.get("EDGETK_CACHE_DIR") or os.path.join(
        toolkit_home(getattr(opts, "bundle", None)), "cache")
    return os.path.abspath(os.path.expanduser(root))


def toolkit_home(bundle=None):
    # type: (Any) -> str
    """The toolkit's home on this device: the one an installed ``bundle`` (``<home>/bundles/NAME/VERSION``) sits
    in, else $EDGETK_HOME (set for devices whose home is not ~/.edgetk, e.g. a read-only root's /data/edgetk),
    else ~/.edgetk."""
    if bundle:
        parts = os.path.abspath(os.path.expanduser(str(bundle))).rstrip("/").split("/")
        if len(parts) > 3 and parts[-3] == "bundles":
            return "/".join(parts[:-3]) or "/"
    return os.path.expanduser(os.environ.get("EDGETK_HOME") or os.path.join("~", ".edgetk"))


def artifact_cache_dir(opts, record, make=True):
    # type: (Any, dict, bool) -> str
    """A directory for one artifact's device-side caches (keyed by its sha256, so a new version starts clean)."""
    key = str(record.get("sha256") or "nohash")[:16]
    path = os.path.join(cache_root(opts), key)
    if make:
        try:
            os.makedirs(path, mode=0o700)
        except OSError:
            pass
    return path


DEFAULT_PROFILE_TOP = 10


DEFAULT_PROFILE_RUNS = 20
