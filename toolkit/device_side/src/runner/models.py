"""One loaded artifact, whatever runs it: the numpy import, Tensor, the load error classifier, the model opened
in the first runtime installed, the placement record and the device-side caches.
"""
import os
import re
import sys
import time
from typing import Any  # noqa: F401
from .base import INSTALL_HINTS, ONNX_RUNTIMES, PACKAGES, PTE_RUNTIMES, REDEPLOY_HINT, RunnerError, TFLITE_RUNTIMES
from .environment import dist_version
from .executorch import native_pte_runner, pte_version_lock
from .executorch_binding import PteModel
from .executorch_native import NativePteModel
from .memory import MEMORY_WORDS, memory_line
from .onnxruntime import OnnxModel
from .tflite import TFLiteModel, load_tflite_delegate, load_tflite_interpreter, tflite_delegate_library

# --- shipped from here (the lines above are for the host's type checker) ---

_NUMPY_ABI = "compiled using NumPy 1.x cannot be run"


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
    if _NUMPY_ABI in text or "_ARRAY_API not found" in text or "numpy.core.multiarray failed" in text:
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


def open_model(path, fmt, record, threads, forced, onnx_options=None):
    # type: (str, str, dict, int, Any, Any) -> Any
    """Load the artifact in the first runtime that is installed (or the forced one); classify failures.

    A TFLite artifact that needs a delegate (Edge TPU) gets it through the runtime's ``load_delegate``; the
    delegate's load time is part of ``load_ms``. ``onnx_options`` go to :class:`OnnxModel` (profiling, caches).
    """
    candidates = {"onnx": ONNX_RUNTIMES, "pte": PTE_RUNTIMES}.get(fmt, TFLITE_RUNTIMES)  # type: tuple
    if forced:
        if forced not in candidates:
            raise RunnerError("usage", "--runtime {} cannot run a .{} artifact (use one of: {}).".format(
                forced, fmt, ", ".join(candidates)))
        candidates = (forced,)
    import_numpy()
    missing = []
    for runtime in candidates:
        t0 = time.perf_counter()
        try:
            if fmt == "onnx":
                import onnxruntime  # noqa: F401
                interpreter_cls = None
            elif fmt == "pte":
                native = native_pte_runner()
                pte_version_lock(record, dist_version("executorch"))
                if native is None:
                    import executorch.runtime  # noqa: F401 (imports torch too: part of import_ms)
                interpreter_cls = None
            else:
                interpreter_cls = load_tflite_interpreter(runtime)
        except ImportError as exc:
            if _NUMPY_ABI in str(exc) or MEMORY_WORDS.search(str(exc)):
                raise classify_load_error(exc, runtime, version_of(runtime))
            missing.append("{} ({})".format(runtime, str(exc).splitlines()[0] if str(exc) else "not installed"))
            continue
        version = version_of(runtime)
        t1 = time.perf_counter()
        delegates = []  # type: list
        library = tflite_delegate_library(record) if fmt == "tflite" else None
        if library:
            delegates.append(load_tflite_delegate(runtime, version, library))
        try:
            if fmt == "onnx":
                providers = [p for p in record.get("execution_providers") or [] if isinstance(p, str)]
                model = OnnxModel(version, path, threads, providers, record, **(onnx_options or {}))  # type: Any
            elif fmt == "pte" and native is not None:
                model = NativePteModel(version, path, threads, native)
            elif fmt == "pte":
                model = PteModel(version, path, threads)
            else:
                model = TFLiteModel(runtime, version, interpreter_cls, path, threads, delegates)
                if library:
                    model.extra["delegate"] = library
            model.import_ms = round((t1 - t0) * 1000.0, 3)
            model.load_ms = round((time.perf_counter() - t1) * 1000.0, 3)
            if isinstance(model, NativePteModel):  # its process start and library linking count as the import
                model.import_ms = round(model.import_ms + model.load_ms - model.native_load_ms, 3)
                model.load_ms = round(model.native_load_ms, 3)
            return model
        except (KeyboardInterrupt, RunnerError):  # RunnerError: the native runner's, kind decided
            raise
        except Exception as exc:  # MemoryError too: classify_load_error names it
            raise classify_load_error(exc, runtime, version)
    if fmt == "onnx":
        hint = INSTALL_HINTS["onnxruntime"] + " (on Jetson: NVIDIA's onnxruntime-gpu wheel for your JetPack)"
    elif fmt == "pte":
        hint = INSTALL_HINTS["executorch"]
    elif forced:
        hint = INSTALL_HINTS[forced]
    else:
        hint = "pip install ai-edge-litert (or, on older images, pip install tflite-runtime 'numpy<2')"
    raise RunnerError(
        "missing_runtime",
        "No runtime for .{} artifacts is installed on this device (tried: {}).".format(fmt, "; ".join(missing)),
        hint,
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
