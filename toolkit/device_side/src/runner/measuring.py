"""What is measured of every artifact: latency statistics, outputs against the golden ones, the page cache.
"""
import math
import os
from typing import Any, Dict  # noqa: F401
from .base import REDEPLOY_HINT, RunnerError
from .environment import safe_name
from .models import Tensor

# --- shipped from here (the lines above are for the host's type checker) ---

def latency_stats(seconds):
    # type: (list) -> dict
    values = sorted(s * 1000.0 for s in seconds)
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n)

    def pct(q):
        # type: (float) -> float
        k = (n - 1) * q
        lo = int(math.floor(k))
        hi = min(lo + 1, n - 1)
        return values[lo] + (values[hi] - values[lo]) * (k - lo)

    out = {"mean": mean, "std": std, "min": values[0], "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
           "max": values[-1]}
    return dict((k, round(v, 6)) for k, v in out.items())


MAX_SAMPLES = 2000


def latency_samples(seconds):
    # type: (list) -> list
    """Every timed run in ms, in the order measured (evenly thinned to MAX_SAMPLES for long --min-time runs)."""
    step = max(1, int(math.ceil(len(seconds) / float(MAX_SAMPLES))))
    return [round(s * 1000.0, 6) for s in seconds[::step]]


def prepare_input(numpy, tensor, array):
    # type: (Any, Tensor, Any) -> Any
    """A golden float input as the runtime wants it: quantized with the tensor's scale/zero point if integer."""
    array = numpy.asarray(array)
    if tensor.quantized:
        info = numpy.iinfo(tensor.dtype)
        q = numpy.round(array.astype(numpy.float64) / tensor.scale + tensor.zero_point)
        array = numpy.clip(q, info.min, info.max)
    array = array.astype(tensor.dtype)
    if tensor.shape and all(d > 0 for d in tensor.shape) and list(array.shape) != tensor.shape:
        if int(numpy.prod(array.shape)) == int(numpy.prod(tensor.shape)):
            array = array.reshape(tensor.shape)
        else:
            raise RunnerError(
                "bad_bundle",
                "A golden input has shape {} but the artifact's input {} expects {}.".format(
                    list(array.shape), tensor.name, tensor.shape),
                "Rebuild the bundle with `edgetk convert`.",
            )
    return numpy.ascontiguousarray(array)


def dequantize(numpy, tensor, array):
    # type: (Any, Tensor, Any) -> Any
    array = numpy.asarray(array)
    if tensor.quantized:
        return (array.astype(numpy.float32) - tensor.zero_point) * numpy.float32(tensor.scale)
    return array.astype(numpy.float32)


def in_manifest_order(tensors, specs):
    # type: (list, Any) -> list
    """The runtime's tensors in the manifest's order (by name where the names match, else as loaded)."""
    names = [s.get("name") for s in specs or [] if isinstance(s, dict)]
    by_name = dict((t.name, t) for t in tensors)
    if names and len(names) == len(tensors) and all(n in by_name for n in names):
        return [by_name[n] for n in names]
    return list(tensors)


def load_npz(numpy, path, prefix):
    # type: (Any, str, str) -> list
    try:
        with numpy.load(path, allow_pickle=False) as data:
            keys = sorted((k for k in data.files if k.startswith(prefix)), key=lambda k: int(k[len(prefix):]))
            return [data[k] for k in keys]
    except (OSError, IOError, ValueError, KeyError) as exc:
        raise RunnerError("bad_bundle", "Cannot read {} ({}).".format(path, exc), REDEPLOY_HINT)


def compare_outputs(numpy, model, bundle, manifest, record, golden_inputs):
    # type: (Any, Any, str, dict, dict, list) -> Any
    """Run every golden sample and compare with what the artifact returned on the host.

    ok when max abs error <= atol; or, where the artifact's outputs are quantized, when the error is at most
    atol + one quantization step AND every classifier output (last dim > 1) agrees on top-1 for every sample
    (a device's int8 kernels may round one step differently from the host's).
    """
    golden = record.get("golden")
    if not isinstance(golden, dict) or not safe_name(golden.get("outputs")):
        return None
    expected = load_npz(numpy, os.path.join(bundle, golden["outputs"]), "output_")
    atol = float(golden.get("atol") or 0.0)
    inputs = in_manifest_order(model.inputs, record.get("inputs"))
    outputs = in_manifest_order(model.outputs, record.get("outputs"))
    if len(golden_inputs) != len(inputs) or len(expected) != len(outputs):
        raise RunnerError("bad_bundle", "The golden data of {} has {} inputs / {} outputs; the artifact has {} / "
                          "{}.".format(record["file"], len(golden_inputs), len(expected), len(inputs),
                                       len(outputs)), "Rebuild the bundle with `edgetk convert`.")
    samples = min([len(g) for g in golden_inputs] + [len(e) for e in expected])
    checks, reference = _slice_checks(numpy, bundle, golden, len(outputs))
    if reference is not None:
        samples = min([samples] + [len(r) for r in reference])
    slice_err = [0.0] * len(checks)
    max_err = 0.0
    agree = []  # type: list
    finite = True
    for i in range(samples):
        model.set_inputs([(t, prepare_input(numpy, t, g[i])) for t, g in zip(inputs, golden_inputs)])
        got = dict((t.key, a) for t, a in zip(model.outputs, model.invoke()))
        for k, tensor in enumerate(outputs):
            actual = dequantize(numpy, tensor, got[tensor.key])
            want = numpy.asarray(expected[k][i], dtype=numpy.float32)
            if actual.size != want.size:
                raise RunnerError("bad_bundle", "Output {} of {} has {} values; its golden output has {}.".format(
                    tensor.name, record["file"], actual.size, want.size), "Rebuild the bundle.")
            actual = actual.reshape(want.shape)
            if not numpy.all(numpy.isfinite(actual)):
                finite = False
                continue
            max_err = max(max_err, float(numpy.max(numpy.abs(actual - want))) if want.size else 0.0)
            if want.ndim >= 1 and want.shape[-1] > 1:
                agree.append(numpy.argmax(actual, axis=-1) == numpy.argmax(want, axis=-1))
            for c, check in enumerate(checks):
                if check["output"] == k and reference is not None:
                    slice_err[c] = max(slice_err[c], _slice_error(numpy, actual, reference[k][i], check))
    top1 = float(numpy.mean(numpy.concatenate([numpy.ravel(a) for a in agree]))) if agree else None
    step = max([t.scale for t in outputs if t.quantized] or [0.0])
    ok = finite and samples > 0 and (
        max_err <= atol or (step > 0 and top1 == 1.0 and max_err <= atol + step * 1.0001))
    result = {
        "max_abs_error": round(max_err, 8) if finite else None,
        "top1_agreement": top1,
        "ok": bool(ok),
        "atol": atol,
        "samples": samples,
    }  # type: Dict[str, Any]
    if checks:
        # the same per-slice limit as the host's verification, against the FLOAT model's outputs: a slice
        # drowned by a wider one (detection scores next to box coordinates under one int8 scale) fails here
        # even when the artifact matches its own host outputs exactly
        slices = []
        for check, err in zip(checks, slice_err):
            ratio = err / check["float_range"]
            slices.append({"name": check["name"], "max_error_ratio": round(ratio, 6), "limit": check["max_error"],
                           "ok": bool(finite and ratio <= check["max_error"])})
        result["slices"] = slices
        result["ok"] = bool(ok) and all(s["ok"] for s in slices)
    return result


def _slice_checks(numpy, bundle, golden, outputs):
    # type: (Any, str, dict, int) -> Any
    """The manifest's per-slice checks of this artifact and the float reference outputs they compare with
    (``([], None)`` for bundles without them)."""
    checks = golden.get("slices")
    if not checks:
        return [], None
    valid = isinstance(checks, list) and safe_name(golden.get("reference")) and all(
        isinstance(c, dict) and isinstance(c.get("output"), int) and 0 <= c["output"] < outputs
        and isinstance(c.get("axis"), int) and isinstance(c.get("runs"), list)
        and isinstance(c.get("float_range"), (int, float)) and c["float_range"] > 0
        and isinstance(c.get("max_error"), (int, float)) for c in checks)
    if not valid:
        raise RunnerError("bad_bundle", "The golden slice checks in manifest.json are malformed.", REDEPLOY_HINT)
    reference = load_npz(numpy, os.path.join(bundle, golden["reference"]), "output_")
    if len(reference) != outputs:
        raise RunnerError("bad_bundle", "The float reference has {} outputs; the artifact has {}.".format(
            len(reference), outputs), REDEPLOY_HINT)
    return checks, reference


def _slice_error(numpy, actual, reference, check):
    # type: (Any, Any, Any, dict) -> float
    """The largest absolute difference between ``actual`` and the float ``reference`` inside the slice."""
    want = numpy.asarray(reference, dtype=numpy.float32).reshape(actual.shape)
    axis = check["axis"]
    if not 0 <= axis < actual.ndim:
        raise RunnerError("bad_bundle", "Slice {} names axis {} of a rank-{} output.".format(
            check["name"], axis, actual.ndim), REDEPLOY_HINT)
    index = []  # type: list
    for run in check["runs"]:
        index.extend(range(int(run[0]), min(int(run[1]), actual.shape[axis])))
    if not index:
        return 0.0
    diff = numpy.abs(numpy.take(actual, index, axis=axis) - numpy.take(want, index, axis=axis))
    return float(numpy.max(diff)) if diff.size else 0.0


def evict_from_page_cache(path):
    # type: (str) -> None
    """Drop the artifact's (and its ONNX external data's) pages from the OS page cache, so the load that
    follows reads the file as it would after a reboot (--cold). Best effort: no-op where fadvise is missing;
    dirty pages and other processes' mappings can keep some pages resident."""
    if not hasattr(os, "posix_fadvise"):
        return
    for candidate in [path] + [os.path.join(os.path.dirname(path), n) for n in os.listdir(os.path.dirname(path))
                               if n.startswith(os.path.basename(path)) and n.endswith(".data")]:
        try:
            fd = os.open(candidate, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)  # dirty pages (a file just written, e.g. by the deploy) cannot be dropped
        except OSError:
            pass
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def resident_fraction(path):
    # type: (str) -> Any
    """The share of ``path``'s pages in the page cache right now (mincore through ctypes), None where unknown."""
    try:
        import ctypes
        import mmap

        size = os.path.getsize(path)
        if size == 0:
            return None
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        page = mmap.PAGESIZE
        pages = (size + page - 1) // page
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                    return None
                return round(sum(1 for v in vec if v & 1) / float(pages), 4)
            finally:
                libc.munmap(ctypes.c_void_p(addr), size)
        finally:
            os.close(fd)
    except Exception:  # no libc (musl without mincore), no ctypes: unknown, said as None
        return None


def drop_from_page_cache(path):
    # type: (str) -> dict
    """Evict the artifact's pages and say whether it worked: {"dropped", "resident_before", "resident_after",
    "note"}. Only the artifact's own pages are touched (no root needed, unlike /proc/sys/vm/drop_caches)."""
    before = resident_fraction(path)
    evict_from_page_cache(path)
    after = resident_fraction(path)
    note = None
    if not hasattr(os, "posix_fadvise"):
        dropped = False
        note = "This Python has no posix_fadvise: the page cache cannot be dropped here; the cold load is warm."
    elif after is None:
        dropped = None
        note = "Whether the pages left the page cache is unknown (mincore is unavailable here)."
    elif after > 0.05:
        dropped = False
        note = ("{:.0f}% of the file's pages stayed in the page cache after posix_fadvise(DONTNEED) (a tmpfs or "
                "overlay file system, or another process maps the file): this cold load is not cold.".format(
                    after * 100))
    else:
        dropped = True
    return {"dropped": dropped, "resident_before": before, "resident_after": after, "note": note}
