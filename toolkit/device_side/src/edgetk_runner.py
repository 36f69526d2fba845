#!/usr/bin/env python3
"""edgetk on-device runner: measure a bundle's artifacts ON the device and print ONE JSON document.

This file is copied into every bundle (``<bundle>/edgetk_runner.py``) and run by ``edgetk check`` on the
device. It must run on Python >= 3.6 (JetPack 4 ships 3.6) with the standard library, numpy and whichever
runtime the device has; it imports nothing from the toolkit. ``probe`` needs the standard library only.

Commands (docs/runner.md has the full schema)::

    python3 edgetk_runner.py probe
    python3 edgetk_runner.py memory [--cgroup DIR]   (MemAvailable, cgroup and ulimit -v limits, OOM-kill counts)
    python3 edgetk_runner.py check --bundle DIR [--artifact FILE]... [--runs N] [--warmup N]
                                   [--min-time SECONDS] [--threads N] [--runtime NAME] [--timeout SECONDS]
    python3 edgetk_runner.py run-one --bundle DIR --artifact FILE [same options]   (one artifact, in-process)
    python3 edgetk_runner.py run-group --bundle DIR --artifact FILE... [same options]   (one import, a fork each)

    check/run-one also take: --profile [--profile-top N] [--profile-runs N], --throughput [--batch-sizes 1,4,8]
    [--in-flight 1,2,4], --loads, --cache-dir DIR (device-side caches: TensorRT engines, optimized models)

Every report carries ``placement`` (the host's placement gate reads it; keep the keys)::

    {"intended", "nodes_total", "nodes_on_intended", "time_share_on_intended", "fallback_ops": [op type, ...],
     "fell_back", "source": "graph" | "profile" | "none", "note"}

``intended`` is the artifact's first ONNX execution provider, or for TFLite ``edgetpu`` / ``gpu`` / ``XNNPACK``;
counts are null where nothing was counted. ``--profile`` adds ``profile`` (per op type and top nodes; ONNX
Runtime's profiler in a second session, latency percentiles stay those of the unprofiled runs; TFLite's Python
interpreters have no op timer, which the profile says), ``--throughput`` adds ``throughput`` (the curve over
batch sizes, or requests in flight for a fixed batch, with batched outputs compared per sample), ``--loads``
adds ``loads`` (cold with the page-cache drop verified, warm, and load options before/after, each a fresh
process). docs/runner.md documents each shape.

``check`` verifies each artifact's sha256 against manifest.json, then measures it in its own child process
(``run-one``) so that a runtime that crashes on one artifact (a segfault in a kernel, an abort in a delegate)
is reported for that artifact while the others still report, and so that peak RSS is per artifact. The .pte
artifacts (SHARED_IMPORT_FORMATS) go to one ``run-group`` child instead, which imports their runtime (torch, where
the Python binding runs them) once and forks a process per artifact: still one process, one crash and one peak RSS
per artifact, one import. Where the native runner (``edgetk-pte-runner``, pte_runner.cpp, beside executorch's
libraries) is installed, each .pte runs in it instead, driven through a framed pipe: no torch anywhere.

Every failure is a JSON error ``{"kind", "message", "hint"}`` with ``kind`` one of ERROR_KINDS
(``missing_runtime``, ``unsupported_op``, ``corrupt_artifact``, ``integrity``, ``crash``, ``bad_bundle``,
``usage``, ``out_of_memory``, ``killed``; ``bad_report`` is the host's). Exit code 0 whenever the JSON document
was printed (even when artifacts failed), 2 for a usage error (still one JSON document). Native libraries that
print to stdout cannot corrupt the document: fd 1 is pointed at stderr while the runner works and the JSON is
written to the saved original stdout at the end. ``check``'s document is framed (REPORT_MARK with its length and
sha256 before it, the end mark after it): the host reads only what is inside a whole frame, so a line a
sitecustomize prints and a report cut short cannot be taken for a report (docs/runner.md, "The frame").

Out of memory is named, not taken for a crash or a damaged file: a ``MemoryError``, a ``std::bad_alloc`` or an
allocation failure under ``ulimit -v`` in a worker, or a worker killed by SIGKILL while the kernel's OOM-kill
count (``/proc/vmstat``, the memory cgroup's ``memory.events``) rose, is ``out_of_memory`` with the file's size,
the peak RSS seen, MemAvailable and the cgroup and ``ulimit -v`` limits. ``check`` writes MEMORY_MARK lines to
stderr (at the start and after each artifact) so the host can tell the same of a runner killed as a whole.

Per artifact report keys read by the host's gates (toolkit/checks/checking.py): ``latency_samples_ms`` (every timed
run in ms, in the order measured, thinned evenly to MAX_SAMPLES; the host stores them so that the regression
gate tests samples from several checks rather than one median) and, where the runtime can tell,
``placement``: ``{"intended", "nodes_total", "nodes_on_intended", "time_share_on_intended",
"fallback_ops": [...]}`` (``intended`` the delegate or execution provider the artifact asks for:
``edgetpu``/``xnnpack``/``gpu`` or an ONNX Runtime provider name; ``fallback_ops`` the nodes that ran
elsewhere, each a string or ``{"name", "op_type", "on"}``).
"""

import argparse
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback
from typing import Any  # noqa: F401 (type comments)

RUNNER_VERSION = "2"  # 2: check's report is framed (1 printed it plain: the host still reads that)
ERROR_KINDS = (
    "missing_runtime",
    "unsupported_op",
    "corrupt_artifact",
    "integrity",
    "crash",
    "bad_bundle",
    "usage",
    "out_of_memory",
    "killed",
    "bad_report",
)
REPORT_MARK = "\x1eedgetk-report"  # check's document: MARK LENGTH SHA256 \n JSON MARK-end \n (docs/runner.md)
MEMORY_MARK = "\x1eedgetk-memory "  # a line on stderr: the memory this run saw so far (the host reads the last)
DEFAULT_RUNS = 100
DEFAULT_WARMUP = 10
DEFAULT_TIMEOUT = 600.0
MAX_TIMED_RUNS = 1000000


def timed_calls(call, args, runs, min_time):
    # type: (Any, tuple, int, float) -> list
    """Seconds of each ``call(*args)``: ``runs`` calls, more until ``min_time`` seconds have passed (at most
    MAX_TIMED_RUNS). Only the call is timed; the loop binds its names once so that microsecond models are not
    dominated by attribute lookups."""
    clock = time.perf_counter
    times = []  # type: list
    append = times.append
    start = clock()
    while len(times) < runs or (clock() - start < min_time and len(times) < MAX_TIMED_RUNS):
        t0 = clock()
        call(*args)
        append(clock() - t0)
    return times


# --- runtime table: shared.py's block, inlined here when assembled (toolkit.device_side) ---


def _runtimes(fmt):
    # type: (str) -> tuple
    return tuple(row["runtime"] for row in RUNTIME_ROWS if row["format"] == fmt)


TFLITE_RUNTIMES = _runtimes("tflite")
ONNX_RUNTIMES = _runtimes("onnx")
PTE_RUNTIMES = _runtimes("pte")
# runtime name -> (import name, distribution names to ask for its version, in order); numpy is asked for too
_PACKAGES = {row["runtime"]: (row["module"], row["distributions"]) for row in RUNTIME_ROWS}
_PACKAGES["numpy"] = ("numpy", ("numpy",))
INSTALL_HINTS = {row["runtime"]: row["install_hint"] for row in RUNTIME_ROWS}
# Debian 12 refuses a plain `pip install numpy` (externally managed): setup makes a venv on the device.
INSTALL_HINTS["numpy"] = (
    "Run `edgetk devices setup --device DEVICE` on the host (numpy and a runtime, in a venv on the device)")
REDEPLOY_HINT = "Push the bundle again (`edgetk deploy`), or rebuild it (`edgetk convert`) if the host copy is bad."


class RunnerError(Exception):
    """A failure the runner reports as ``{"kind", "message", "hint"}`` instead of a traceback."""

    def __init__(self, kind, message, hint=None, detail=None):
        # type: (str, str, Any, Any) -> None
        Exception.__init__(self, message)
        self.kind = kind
        self.message = message
        self.hint = hint
        self.detail = detail

    def to_dict(self):
        # type: () -> dict
        out = {"kind": self.kind, "message": self.message, "hint": self.hint}
        if self.detail:
            out["detail"] = self.detail
        return out


class UsageFailure(Exception):
    """Raised by the argument parser instead of printing usage text and exiting."""


# ------------------------------------------------------------------------------------------ environment


# --- device probe: device_probe.py's block, inlined here when assembled (toolkit.device_side) ---


def environment():
    # type: () -> dict
    """What the device is and what state it is in right now (clocks, temperature): stdlib only."""
    return probe_environment()


def _normalize(name):
    # type: (str) -> str
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_version(dist):
    # type: (str) -> Any
    """Version of an installed distribution without importing it (importlib.metadata, else a dist-info scan)."""
    try:
        from importlib import metadata  # novermin (Python >= 3.8; older ones scan dist-info below)

        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    except ImportError:
        pass
    wanted = _normalize(dist)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            match = re.match(r"^(.+?)-([^-]+?)(?:-py[\d.]+)?\.(?:dist-info|egg-info)$", name)
            if match and _normalize(match.group(1)) == wanted:
                return match.group(2)
    return None


def runtime_versions():
    # type: () -> dict
    out = {}
    for runtime, (module, dists) in _PACKAGES.items():
        version = None
        if probe_module_present(module):
            for dist in dists:
                version = _dist_version(dist)
                if version:
                    break
            version = version or "unknown"
        out[runtime] = version
    return out


def onnxruntime_providers():
    # type: () -> list
    if not probe_module_present("onnxruntime"):
        return []
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers())
    except Exception:  # a broken install (e.g. numpy missing) is reported by the versions, not here
        return []


def probe():
    # type: () -> dict
    return {
        "runner_version": RUNNER_VERSION,
        "environment": environment(),
        "runtimes": runtime_versions(),
        "onnxruntime_providers": onnxruntime_providers(),
    }


# ------------------------------------------------------------------------------------------- bundle


def _safe_name(name):
    # type: (Any) -> bool
    return (
        isinstance(name, str)
        and bool(name)
        and not name.startswith(("/", "~"))
        and "\\" not in name
        and ".." not in name.split("/")
    )


def read_manifest(bundle):
    # type: (str) -> dict
    path = os.path.join(bundle, "manifest.json")
    if not os.path.isdir(bundle):
        raise RunnerError("bad_bundle", "{} is not a directory.".format(bundle),
                          "Pass the bundle directory (on the device: ~/.edgetk/bundles/<name>/current).")
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, IOError):
        raise RunnerError("bad_bundle", "{} has no readable manifest.json.".format(bundle), REDEPLOY_HINT)
    except ValueError as exc:
        raise RunnerError("bad_bundle", "manifest.json in {} is not valid JSON ({}).".format(bundle, exc),
                          REDEPLOY_HINT)
    artifacts = data.get("artifacts") if isinstance(data, dict) else None
    if not isinstance(artifacts, list) or not all(isinstance(a, dict) and _safe_name(a.get("file"))
                                                  for a in artifacts):
        raise RunnerError("bad_bundle", "manifest.json in {} has no valid 'artifacts' list.".format(bundle),
                          REDEPLOY_HINT)
    return data


# --- file hash: shared.py's block, inlined here when assembled (toolkit.device_side) ---


def verify_artifact(bundle, record):
    # type: (str, dict) -> None
    """Refuse an artifact that is missing or whose sha256 differs from manifest.json."""
    name = record["file"]
    path = os.path.join(bundle, name)
    if not os.path.isfile(path):
        raise RunnerError("bad_bundle", "The artifact {} listed in manifest.json is missing.".format(name),
                          REDEPLOY_HINT)
    expected = record.get("sha256")
    actual = sha256_file(path)
    if not isinstance(expected, str) or actual != expected.lower():
        raise RunnerError(
            "integrity",
            "{} does not match its sha256 in manifest.json (expected {}, found {}); not measured.".format(
                name, expected, actual),
            REDEPLOY_HINT,
        )


ON_DEMAND_HINT = ("Remove the file on the device (the next `edgetk check` pushes the bundle's copy again, checked "
                  "on the host first).")


def on_demand_file(bundle, manifest, name):
    # type: (str, dict, str) -> str
    """The path of ``name``, a file the host pushes only when a check asks (the eval set, a layer probe), after
    checking it against its sha256 in manifest.json's ``on_demand``; refused when missing, unrecorded or
    different, like an artifact."""
    entry = [e for e in manifest.get("on_demand") or [] if isinstance(e, dict) and e.get("file") == name]
    if not entry or not _safe_name(name):
        raise RunnerError("bad_bundle", "{} is not recorded in manifest.json (a bundle from an older edgetk); "
                          "not used.".format(name), "Convert the bundle again, then deploy it.")
    path = os.path.join(bundle, name)
    if not os.path.isfile(path) or os.path.islink(path):
        raise RunnerError("bad_bundle", "{} is missing on the device.".format(name),
                          "Run the check again: the host pushes it when a check asks for it.")
    expected = entry[0].get("sha256")
    actual = sha256_file(path)
    if not isinstance(expected, str) or actual != expected.lower():
        raise RunnerError("integrity", "{} does not match its sha256 in manifest.json (expected {}, found {}); "
                          "not used.".format(name, expected, actual), ON_DEMAND_HINT)
    return path


def _artifact_format(record):
    # type: (dict) -> str
    fmt = record.get("format")
    if fmt in ("tflite", "onnx", "pte"):
        return fmt
    for suffix in ("onnx", "pte"):
        if str(record["file"]).endswith("." + suffix):
            return suffix
    return "tflite"


def _default_threads(manifest, record):
    # type: (dict, dict) -> int
    for source in (record.get("recipe"), manifest.get("runtime_preferences")):
        if isinstance(source, dict):
            value = source.get("threads")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return os.cpu_count() or 1


# ------------------------------------------------------------------------------------------ memory


MEMORY_WORDS = re.compile(r"MemoryError|bad_alloc|out of memory|Cannot allocate memory|failed to map segment|"
                          r"Failed to allocate|Unable to allocate|Memory allocation|ENOMEM", re.I)
OOM_HINT = ("Try a smaller artifact (an int8 one), fewer threads (--threads 1), or free memory on the device "
            "(stop other services, or raise its cgroup's memory limit or `ulimit -v`).")
CGROUP_ROOT = "/sys/fs/cgroup"


def _mb(value):
    # type: (Any) -> Any
    return None if value is None else round(value / (1024.0 * 1024.0), 1)


def own_cgroup():
    # type: () -> Any
    """The folder of this process's memory cgroup: v1's memory controller where it is mounted, else the v2
    unified hierarchy's (None where neither can be read)."""
    unified = None
    for line in (probe_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            folder = os.path.normpath(os.path.join(CGROUP_ROOT, "memory") + parts[2])
            if os.path.isdir(folder):
                return folder
        elif parts[0] == "0" and not parts[1]:
            unified = os.path.normpath(CGROUP_ROOT + parts[2])
    return unified if unified and os.path.isdir(unified) else None


def _counter(text, key):
    # type: (Any, str) -> Any
    match = re.search(r"^%s (\d+)\s*$" % key, text or "", re.M)
    return int(match.group(1)) if match else None


def oom_kills(cgroup=None):
    # type: (Any) -> dict
    """The kernel's OOM-kill counts: ``system`` (/proc/vmstat) and ``cgroup`` (the memory cgroup's memory.events,
    or v1's memory.oom_control), None each where it cannot be read."""
    group = None
    if cgroup:
        group = _counter(probe_read(os.path.join(cgroup, "memory.events")), "oom_kill")
        if group is None:
            group = _counter(probe_read(os.path.join(cgroup, "memory.oom_control")), "oom_kill")
    return {"system": _counter(probe_read("/proc/vmstat", 1 << 20), "oom_kill"), "cgroup": group}


def oom_rose(before, after):
    # type: (Any, Any) -> Any
    """True when an OOM-kill count rose between two :func:`oom_kills`, None when neither count could be read."""
    known = [k for k in ("system", "cgroup") if (before or {}).get(k) is not None and (after or {}).get(k) is not None]
    if not known:
        return None
    return any(after[k] > before[k] for k in known)


def _cgroup_value(folder, names):
    # type: (str, tuple) -> Any
    for name in names:
        text = (probe_read(os.path.join(folder, name)) or "").strip()
        if text.isdigit() and int(text) < (1 << 60):  # v2's "max" and v1's huge number: no limit
            return int(text)
    return None


def cgroup_limit_bytes(cgroup):
    # type: (Any) -> Any
    """The smallest memory limit from ``cgroup`` up to its hierarchy's root (a parent's limit binds too)."""
    limits = []
    folder = cgroup
    while folder and folder.startswith(CGROUP_ROOT) and len(folder) > len(CGROUP_ROOT):
        limit = _cgroup_value(folder, ("memory.max", "memory.limit_in_bytes"))
        if limit is not None:
            limits.append(limit)
        folder = os.path.dirname(folder)
    return min(limits) if limits else None


def _children_peak_mb():
    # type: () -> Any
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    except (ImportError, AttributeError):
        return None
    return round(rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0, 1) or None


def peak_seen_mb():
    # type: () -> Any
    """The largest resident size this process or any of its ended children reached, in MB."""
    peaks = [p for p in (_peak_rss_mb(), _children_peak_mb()) if p]
    return max(peaks) if peaks else None


def memory_facts(cgroup=None):
    # type: (Any) -> dict
    """What memory the device has for this run: MemAvailable, the cgroup's limit and peak, ``ulimit -v``, the
    OOM-kill counts, the peak this process saw (MB; None where unknown)."""
    cgroup = cgroup or own_cgroup()
    address_space = None
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        address_space = None if soft == resource.RLIM_INFINITY else soft
    except (ImportError, AttributeError, ValueError):
        pass
    return {
        "available_mb": _mb(available_memory_bytes()),
        "cgroup": cgroup,
        "cgroup_limit_mb": _mb(cgroup_limit_bytes(cgroup)) if cgroup else None,
        "cgroup_peak_mb": _mb(_cgroup_value(cgroup, ("memory.peak", "memory.max_usage_in_bytes"))) if cgroup else None,
        "address_space_limit_mb": _mb(address_space),
        "oom_kills": oom_kills(cgroup),
        "peak_rss_mb": peak_seen_mb(),
    }


def note_memory(facts=None):
    # type: (Any) -> None
    """One MEMORY_MARK line on stderr: what the host reports when this whole process is killed."""
    try:
        sys.stderr.write(MEMORY_MARK + json.dumps(facts or memory_facts()) + "\n")
        sys.stderr.flush()
    except (IOError, OSError, ValueError):
        pass


def _memory_line(text):
    # type: (str) -> str
    """The line of ``text`` that says memory ran out (numpy's ImportError is a page of advice), else its last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if MEMORY_WORDS.search(line)]
    return (said or lines or [text])[-1][:300]


def out_of_memory(name, path, how, peak_mb=None):
    # type: (str, Any, str, Any) -> dict
    """The ``out_of_memory`` error of artifact ``name``: ``how`` it ran out, with the file's size, the peak RSS
    seen, what the device has available and its limits, and what to try."""
    facts = memory_facts()
    try:
        size = os.path.getsize(path) if path else None
    except OSError:
        size = None
    peak = peak_mb or facts["peak_rss_mb"]
    how = _memory_line(how)
    has = ["MemAvailable {:g} MB".format(facts["available_mb"]) if facts["available_mb"] is not None
           else "MemAvailable unknown"]
    if facts["cgroup_limit_mb"] is not None:
        has.append("cgroup limit {:g} MB".format(facts["cgroup_limit_mb"]))
    if facts["address_space_limit_mb"] is not None:
        has.append("ulimit -v {:g} MB".format(facts["address_space_limit_mb"]))
    message = "{} ran out of memory on the device ({}): file {}, peak seen {}; the device has {}.".format(
        name, how, "size unknown" if size is None else "{:.1f} MB".format(size / 1e6) if size >= 100000
        else "{:.1f} KB".format(size / 1e3), "{:g} MB".format(peak) if peak else "unknown", ", ".join(has))
    error = RunnerError("out_of_memory", message, OOM_HINT).to_dict()
    error["memory"] = dict(facts, file_bytes=size, peak_rss_mb=peak)
    return error


# ------------------------------------------------------------------------------------------ runtimes


_NUMPY_ABI = "compiled using NumPy 1.x cannot be run"


def _import_numpy():
    try:
        import numpy
    except ImportError as exc:
        if MEMORY_WORDS.search(str(exc)):  # a shared library that cannot be mapped under ulimit -v
            raise RunnerError("out_of_memory", "importing numpy: {}".format(_memory_line(str(exc))))
        raise RunnerError("missing_runtime", "numpy cannot be imported on this device ({}).".format(exc),
                          INSTALL_HINTS["numpy"])
    return numpy


def _load_tflite_interpreter(runtime):
    # type: (str) -> Any
    """The Interpreter class of one TFLite runtime (ImportError when it is not installed)."""
    if runtime == "litert":
        from ai_edge_litert.interpreter import Interpreter
    elif runtime == "tflite-runtime":
        from tflite_runtime.interpreter import Interpreter
    else:
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    return Interpreter


def _version_of(runtime):
    # type: (str) -> Any
    module, dists = _PACKAGES[runtime]
    for dist in dists:
        version = _dist_version(dist)
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
                label.strip(), _dist_version("numpy"), short),
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


def _np_dtype(numpy, ort_type):
    # type: (Any, str) -> Any
    table = {
        "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
        "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16", "tensor(uint16)": "uint16",
        "tensor(int32)": "int32", "tensor(int64)": "int64", "tensor(bool)": "bool",
    }
    return numpy.dtype(table.get(ort_type, "float32"))


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


class TFLiteModel(object):
    format = "tflite"

    def __init__(self, runtime, version, interpreter_cls, path, threads, delegates=None):
        # type: (str, Any, Any, str, int, Any) -> None
        self.runtime = runtime
        self.version = version
        if delegates:
            self.interpreter = interpreter_cls(model_path=path, num_threads=threads,
                                               experimental_delegates=list(delegates))
        else:
            self.interpreter = interpreter_cls(model_path=path, num_threads=threads)
        self.interpreter.allocate_tensors()
        self.inputs = [self._tensor(d) for d in self.interpreter.get_input_details()]
        self.outputs = [self._tensor(d) for d in self.interpreter.get_output_details()]
        self.extra = {}  # type: dict
        self.delegates = list(delegates or [])

    @staticmethod
    def _tensor(detail):
        # type: (dict) -> Tensor
        numpy = _import_numpy()
        scale, zero = detail.get("quantization", (0.0, 0))
        signature = detail.get("shape_signature")
        return Tensor(detail["name"], [int(d) for d in detail["shape"]], numpy.dtype(detail["dtype"]),
                      float(scale), int(zero), detail["index"],
                      [int(d) for d in signature] if signature is not None else None)

    def dynamic_batch(self):
        # type: () -> bool
        return bool(self.inputs) and all(t.signature and t.signature[0] == -1 for t in self.inputs)

    def resize_batch(self, batch):
        # type: (int) -> None
        """Resize every input's batch dimension (only for a dynamic batch) and re-allocate."""
        for tensor in self.inputs:
            self.interpreter.resize_tensor_input(tensor.key, [batch] + list(tensor.shape[1:]))
        self.interpreter.allocate_tensors()
        self.inputs = [self._tensor(d) for d in self.interpreter.get_input_details()]
        self.outputs = [self._tensor(d) for d in self.interpreter.get_output_details()]

    def set_inputs(self, pairs):
        # type: (list) -> None
        """``pairs``: [(Tensor, array)] in any order."""
        for tensor, array in pairs:
            self.interpreter.set_tensor(tensor.key, array)

    def invoke(self):
        # type: () -> list
        self.interpreter.invoke()
        return [self.interpreter.get_tensor(t.key) for t in self.outputs]

    def timed_loop(self, runs, min_time):
        # type: (int, float) -> list
        """Only ``invoke()`` is timed (as TFLite's benchmark_model does); the inputs were set once before.

        The outputs are already in the interpreter's buffers when invoke returns; copying them out with
        get_tensor (about 1 us) is left out so that microsecond models are not dominated by the Python API.
        """
        return timed_calls(self.interpreter.invoke, (), runs, min_time)


# ExecuTorch ScalarType codes -> numpy dtype names
PTE_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                    7: "float64", 11: "bool"}


class PteModel(object):
    """An ExecuTorch program's ``forward`` through the Python bindings (``executorch.runtime``), which take and
    return torch tensors. Tensors are named ``input_<i>`` / ``output_<i>`` as the manifest records them (a .pte
    carries no names). ``etdump`` loads it with ExecuTorch's event tracer on (per-operator times)."""

    format = "pte"

    def __init__(self, version, path, threads, etdump=False):
        # type: (Any, str, int, bool) -> None
        import torch
        from executorch.runtime import Runtime

        numpy = _import_numpy()
        self.runtime = "executorch"
        self.version = version
        self.torch = torch
        runtime = Runtime.get()
        try:
            from executorch.extension.pybindings import portable_lib

            portable_lib._unsafe_reset_threadpool(int(threads))
        except Exception:  # an older binding without it: ExecuTorch's own default pool
            pass
        if etdump:
            self.program = runtime.load_program(path, enable_etdump=True, debug_buffer_size=0)
        else:
            self.program = runtime.load_program(path)
        self.method = self.program.load_method("forward")
        meta = self.program.metadata("forward")
        self.inputs = [self._tensor(numpy, "input", i, meta.input_tensor_meta(i)) for i in range(meta.num_inputs())]
        self.outputs = [self._tensor(numpy, "output", i, meta.output_tensor_meta(i))
                        for i in range(meta.num_outputs())]
        self.backends = sorted(runtime.backend_registry.registered_backend_names)
        self.extra = {"backends": self.backends, "path": "python-binding", "note": PTE_TORCH_NOTE}
        self.args = []  # type: list

    @staticmethod
    def _tensor(numpy, what, index, info):
        # type: (Any, str, int, Any) -> Tensor
        dtype = numpy.dtype(PTE_SCALAR_TYPES.get(int(info.dtype()), "float32"))
        return Tensor("{}_{}".format(what, index), [int(d) for d in info.sizes()], dtype, 0.0, 0, index)

    def dynamic_batch(self):
        # type: () -> bool
        return False

    def resize_batch(self, batch):
        # type: (int) -> None
        """A .pte runs the batch it was exported with."""

    def set_inputs(self, pairs):
        # type: (list) -> None
        numpy = _import_numpy()
        args = [None] * len(self.inputs)  # type: list
        for tensor, array in pairs:
            args[tensor.key] = self.torch.from_numpy(numpy.ascontiguousarray(array))
        self.args = args

    def invoke(self):
        # type: () -> list
        return [out.numpy() for out in self.method.execute(self.args)]

    def timed_loop(self, runs, min_time):
        # type: (int, float) -> list
        return timed_calls(self.method.execute, (self.args,), runs, min_time)


# --- the native .pte runner (toolkit/device_side/pte_runner.cpp), driven through a framed pipe ---

PTE_RUNNER_BINARY = "edgetk-pte-runner"  # installed by setup into executorch's lib/ folder, beside its libraries
PTE_NUMPY_CODES = dict((name, code) for code, name in PTE_SCALAR_TYPES.items())
PTE_ERROR_KINDS = {0x10: "unsupported_op", 0x11: "unsupported_op", 0x14: "unsupported_op", 0x30: "unsupported_op",
                   0x21: "crash", 0x25: "crash", 0x31: "crash"}  # ExecuTorch's Error codes; the rest: corrupt
PTE_TORCH_NOTE = ("ran through ExecuTorch's Python binding, which imports torch (its load time and peak memory "
                  "include torch's): the native runner is not installed here; `edgetk devices setup --runtime "
                  "executorch` installs it")


def executorch_lib_dir():
    # type: () -> Any
    """executorch's ``lib/`` folder (its runtime libraries) in this Python, found without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("executorch")
    except (ImportError, ValueError):
        return None
    for folder in (list(spec.submodule_search_locations or []) if spec else []):
        if os.path.isdir(os.path.join(folder, "lib")):
            return os.path.join(folder, "lib")
    return None


def native_pte_runner():
    # type: () -> Any
    """(binary, lib folder) of the native runner beside this Python's executorch, or None when not installed."""
    lib = executorch_lib_dir()
    binary = os.path.join(lib, PTE_RUNNER_BINARY) if lib else None
    if binary and os.path.isfile(binary) and os.access(binary, os.X_OK):
        return binary, lib
    return None


def pte_version_lock(record, installed):
    # type: (dict, Any) -> None
    """Refuse a .pte whose exporter's executorch is not this device's: ExecuTorch promises no compatibility
    between versions, and a mismatch fails in ways that read like a damaged file."""
    info = record.get("pte") if isinstance(record.get("pte"), dict) else {}
    wanted = info.get("executorch_version")
    if wanted and installed and installed != wanted:
        raise RunnerError(
            "missing_runtime",
            "{} was exported by executorch {}; this device has executorch {}, which is not guaranteed to load "
            "it.".format(record.get("file"), wanted, installed),
            "Install executorch=={} on the device: `edgetk devices setup --device DEVICE --runtime executorch` "
            "(or pip install --no-deps executorch=={}), or convert with executorch {} on the host.".format(
                wanted, wanted, installed))


class NativePte(object):
    """One native runner process holding one loaded program; requests and replies are frames on its pipes."""

    def __init__(self, binary, lib, path, threads, profile=False):
        # type: (str, str, str, int, bool) -> None
        import tempfile

        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        self.log = tempfile.TemporaryFile()  # ExecuTorch's own log lines; their tail names a failure
        argv = [binary, path, "forward", str(int(threads))] + (["profile"] if profile else [])
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env=env)
        self.hello = self.reply()

    def _died(self):
        # type: () -> RunnerError
        code = self.proc.wait()
        self.log.seek(0)
        tail = self.log.read().decode("utf-8", "replace").strip().splitlines()[-3:]
        how = "signal {}".format(_signal_name(-code)) if code < 0 else "exit status {}".format(code)
        return RunnerError("crash", "The native .pte runner died ({}): {}".format(how, " | ".join(tail)[-600:]),
                           "Run the check again with --debug; a signal here is a crash inside ExecuTorch's "
                           "kernels or delegate.")

    def _read(self, size):
        # type: (int) -> bytes
        chunks, left = [], size
        while left:
            chunk = self.proc.stdout.read(left)
            if not chunk:
                raise self._died()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def reply(self):
        # type: () -> tuple
        """(JSON document, raw tail) of the next reply; a failed reply raises RunnerError."""
        import struct

        size = struct.unpack("<I", self._read(4))[0]
        body = self._read(size)
        head = struct.unpack("<I", body[:4])[0]
        doc = json.loads(body[4:4 + head].decode("utf-8"))
        if not doc.get("ok"):
            self.log.seek(0)
            tail = self.log.read().decode("utf-8", "replace").strip().splitlines()[-2:]
            kind = PTE_ERROR_KINDS.get(doc.get("code"), "corrupt_artifact")
            raise RunnerError(kind, "executorch {}: {} (Error 0x{:x}){}".format(
                doc.get("executorch") or "", doc.get("error"), max(0, doc.get("code") or 0),
                ": " + " | ".join(tail)[-400:] if tail else ""),
                REDEPLOY_HINT if kind == "corrupt_artifact" else None)
        return doc, body[4 + head:]

    def request(self, op, payload=b""):
        # type: (bytes, bytes) -> tuple
        import struct

        try:
            self.proc.stdin.write(struct.pack("<I", 1 + len(payload)) + op + payload)
            self.proc.stdin.flush()
        except (IOError, OSError):
            raise self._died()
        return self.reply()

    def set_inputs(self, arrays):
        # type: (list) -> None
        """``arrays``: (ScalarType code, shape, raw bytes) per input, in the method's order."""
        import struct

        parts = [struct.pack("<I", len(arrays))]
        for code, shape, data in arrays:
            parts.append(struct.pack("<BB", code, len(shape)) + struct.pack("<{}q".format(len(shape)), *shape))
            parts.append(struct.pack("<Q", len(data)) + data)
        self.request(b"I", b"".join(parts))

    def run(self, numpy):
        # type: (Any) -> list
        doc, tail = self.request(b"R")
        outputs, at = [], 0
        for info in doc["tensors"]:
            dtype = numpy.dtype(PTE_SCALAR_TYPES.get(info["dtype"], "float32"))
            data = tail[at:at + info["nbytes"]]
            at += info["nbytes"]
            outputs.append(numpy.frombuffer(data, dtype).reshape(info["shape"]).copy())
        return outputs

    def timed(self, runs, min_time):
        # type: (int, float) -> list
        import struct

        doc, tail = self.request(b"T", struct.pack("<Id", int(runs), float(min_time)))
        return list(struct.unpack("<{}d".format(doc["count"]), tail))

    def close(self):
        # type: () -> None
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"\x01\x00\x00\x00Q")
                self.proc.stdin.close()
            except (IOError, OSError):
                pass
            self.proc.wait()


class NativePteModel(object):
    """A .pte through the native runner: ExecuTorch's runtime libraries alone, no torch in any process. Its
    ``load_ms`` is the runner's own (program and method loaded, mmap data loader); ``peak_rss_mb`` the runner
    process's own peak, the program's memory rather than Python's."""

    format = "pte"

    def __init__(self, version, path, threads, runner, profile=False):
        # type: (Any, str, int, tuple, bool) -> None
        numpy = _import_numpy()
        self.runtime = "executorch"
        self.version = version
        self.path = path
        self.threads = threads
        self.runner = runner
        self.process = NativePte(runner[0], runner[1], path, threads, profile)
        hello = self.process.hello[0]
        self.native_load_ms = hello.get("load_ms")
        self.inputs = [Tensor("input_{}".format(i), list(t["shape"]), numpy.dtype(PTE_SCALAR_TYPES.get(
            t["dtype"], "float32")), 0.0, 0, i) for i, t in enumerate(hello["inputs"])]
        self.outputs = [Tensor("output_{}".format(i), list(t["shape"]) if t else [], numpy.dtype(
            PTE_SCALAR_TYPES.get((t or {}).get("dtype"), "float32")), 0.0, 0, i)
            for i, t in enumerate(hello["outputs"])]
        self.backends = sorted(hello.get("backends") or [])
        self.extra = {"backends": self.backends, "path": "native",
                      "native": {"executorch": hello.get("executorch"), "binary": runner[0]}}

    def dynamic_batch(self):
        # type: () -> bool
        return False

    def resize_batch(self, batch):
        # type: (int) -> None
        """A .pte runs the batch it was exported with."""

    def set_inputs(self, pairs):
        # type: (list) -> None
        numpy = _import_numpy()
        arrays = [None] * len(self.inputs)  # type: list
        for tensor, array in pairs:
            array = numpy.ascontiguousarray(array)
            arrays[tensor.key] = (PTE_NUMPY_CODES[array.dtype.name], list(array.shape), array.tobytes())
        self.process.set_inputs(arrays)

    def invoke(self):
        # type: () -> list
        return self.process.run(_import_numpy())

    def timed_loop(self, runs, min_time):
        # type: (int, float) -> list
        return self.process.timed(runs, min_time)

    def peak_rss_mb(self):
        # type: () -> Any
        return round(self.process.request(b"S")[0]["peak_rss_kb"] / 1024.0, 1)

    def profile(self, first, runs):
        # type: (list, int) -> list
        """Per-operator times of ``runs`` calls in a second runner loaded with ETDump's event tracer."""
        traced = NativePte(self.runner[0], self.runner[1], self.path, self.threads, profile=True)
        try:
            model = object.__new__(NativePteModel)
            model.inputs, model.process = self.inputs, traced
            NativePteModel.set_inputs(model, first)
            for _ in range(runs):
                traced.run(_import_numpy())
            return traced.request(b"P")[0]["ops"]
        finally:
            traced.close()


def read_bundled_program(data):
    # type: (bytes) -> tuple
    """A bundled program (``.bpte``, ExecuTorch's ``bundled_program_schema.fbs``, a flatbuffer) read with no
    flatbuffers library: (program bytes, [(inputs, expected outputs)] of the ``forward`` suite), each value a
    (ScalarType code, sizes, raw bytes) tensor."""
    import struct

    def u32(at):
        return struct.unpack_from("<I", data, at)[0]

    def field(table, index):  # the position of a table's field, None when absent
        vtable = table - struct.unpack_from("<i", data, table)[0]
        slot = 4 + 2 * index
        if slot >= struct.unpack_from("<H", data, vtable)[0]:
            return None
        offset = struct.unpack_from("<H", data, vtable + slot)[0]
        return table + offset if offset else None

    def ref(at):  # follow an offset to a table, vector or string
        return at + u32(at)

    def tables(table, index):
        at = field(table, index)
        if at is None:
            return []
        vector = ref(at)
        return [ref(vector + 4 + 4 * i) for i in range(u32(vector))]

    def raw(table, index, width=1):  # a vector of scalars ``width`` bytes each, as bytes
        at = field(table, index)
        if at is None:
            return b""
        vector = ref(at)
        return data[vector + 4:vector + 4 + width * u32(vector)]

    def tensor(value):  # Value { val_type: ubyte, val: ValueUnion }; ValueUnion 1 = Tensor
        kind = field(value, 0)
        if kind is None or struct.unpack_from("<B", data, kind)[0] != 1:
            raise ValueError("the bundled program holds a value that is not a tensor")
        table = ref(field(value, 1))
        code_at = field(table, 0)
        sizes = raw(table, 1, 4)
        return (struct.unpack_from("<b", data, code_at)[0] if code_at is not None else 0,
                list(struct.unpack("<{}i".format(len(sizes) // 4), sizes)), raw(table, 2))

    root = ref(0)
    cases = []
    for suite in tables(root, 1):
        name_at = field(suite, 0)
        name = data[ref(name_at) + 4:ref(name_at) + 4 + u32(ref(name_at))].decode() if name_at else ""
        if name == "forward":
            cases = [([tensor(v) for v in tables(case, 0)], [tensor(v) for v in tables(case, 1)])
                     for case in tables(suite, 1)]
    return raw(root, 2), cases


def native_bundled_check(model, bundle, record, name, atol):
    # type: (Any, str, dict, str, float) -> dict
    """The bundled program's cases run by the native runner, each output within ``atol`` of its expected one
    (what ExecuTorch's verifier does at rtol 0). The program it bundles is the artifact (same bytes) or, if not,
    run in a runner of its own."""
    import hashlib
    import tempfile

    numpy = _import_numpy()
    with open(os.path.join(bundle, name), "rb") as handle:
        program, cases = read_bundled_program(handle.read())
    process, folder = model.process, None
    if hashlib.sha256(program).hexdigest() != record.get("sha256"):
        folder = tempfile.mkdtemp(prefix="edgetk-bpte-")
        with open(os.path.join(folder, "program.pte"), "wb") as out:
            out.write(program)
        process = NativePte(model.runner[0], model.runner[1], os.path.join(folder, "program.pte"), model.threads)
    failed = []  # type: list
    try:
        for index, (inputs, expected) in enumerate(cases):
            process.set_inputs(inputs)
            got = process.run(numpy)
            for actual, (code, sizes, data) in zip(got, expected):
                want = numpy.frombuffer(data, PTE_SCALAR_TYPES.get(code, "float32")).reshape(sizes)
                if actual.shape != want.shape or not numpy.all(
                        numpy.abs(actual.astype("float64") - want.astype("float64")) <= atol):
                    failed.append(index)
                    break
            else:
                if len(got) != len(expected):
                    failed.append(index)
    finally:
        if folder:
            process.close()
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    return {"ok": bool(cases) and not failed, "cases": len(cases), "failed": failed, "atol": atol, "file": name,
            "path": "native"}


def pte_bundled_check(bundle, record, model=None):
    # type: (str, dict, Any) -> Any
    """The artifact's ExecuTorch bundled program (``model.<p>.bpte``): every bundled input against the float
    model's outputs at the manifest's ``bundled_atol``, through the native runner when ``model`` is one, else by
    ExecuTorch's own verifier in the Python binding. None when the bundle has none; ``{"ok", "cases", "failed",
    "atol"}`` otherwise (this device checked its own numbers)."""
    info = record.get("pte")
    name = info.get("bundled") if isinstance(info, dict) else None
    if not _safe_name(name) or not os.path.isfile(os.path.join(bundle, name)):
        return None
    atol = float(info.get("bundled_atol") or 0.0)
    if isinstance(model, NativePteModel):
        return native_bundled_check(model, bundle, record, name, atol)
    from executorch.extension.pybindings import portable_lib

    with open(os.path.join(bundle, name), "rb") as handle:
        bundled = portable_lib._load_bundled_program_from_buffer(handle.read())
    cases, failed = 0, []  # type: (int, list)
    while True:
        try:
            bundled.verify_result_with_bundled_expected_output("forward", cases, 0.0, atol)
        except (IndexError, ValueError):
            break
        except RuntimeError as exc:
            text = str(exc)
            if "0x12" in text or "status 18" in text:  # InvalidArgument: past the last case
                break
            failed.append(cases)
        cases += 1
        if cases >= 64:
            break
    return {"ok": bool(cases) and not failed, "cases": cases, "failed": failed, "atol": atol, "file": name,
            "path": "python-binding"}


def pte_placement(record):
    # type: (dict) -> dict
    """What the convert stage counted: the XNNPACK delegate's share of the program's operator nodes."""
    info = record.get("pte") if isinstance(record.get("pte"), dict) else {}
    total, on = info.get("total_nodes"), info.get("delegated_nodes")
    share = float(on) / total if isinstance(total, int) and isinstance(on, int) and total else None
    return placement_record(XNNPACK, total, on, None, [], "graph" if total else "none",
                            "XNNPACK delegated {} of {} operator nodes at convert time ({:.0%}); the rest runs on "
                            "ExecuTorch's portable kernels.".format(on, total, share or 0.0) if total else
                            "the manifest records no delegation count")


def pte_profile(model, path, record, threads, first, top):
    # type: (Any, str, dict, int, list, int) -> Any
    """Per-operator times from ExecuTorch's ETDump: a second program loaded with the event tracer, run
    ``DEFAULT_PROFILE_RUNS`` times, its ETDump read by ``executorch.devtools.Inspector`` (delegate calls and
    portable operators by name). The Python wheel's runtime may be built without the tracer: then it says so."""
    import tempfile

    if isinstance(model, NativePteModel):
        ops = [{"name": op["name"], "calls": op["calls"], "total_ms": round(op["ns"] / 1e6, 4),
                "mean_ms": round(op["ns"] / 1e6 / op["calls"], 5)} for op in model.profile(first, DEFAULT_PROFILE_RUNS)
               if op["calls"] and not op["name"].startswith(("Method::", "Program::"))]  # the call, the load
        if not ops:
            return {"available": False, "error": "this ExecuTorch build reported no profiling events"}
        ops.sort(key=lambda e: -e["total_ms"])
        return {"available": True, "source": "etdump", "runs": DEFAULT_PROFILE_RUNS, "top": ops[:top]}
    traced = PteModel(model.version, path, threads, etdump=True)
    if not traced.program._program.has_etdump():
        return {"available": False, "error": "this ExecuTorch build has no event tracer (ETDump)"}
    traced.set_inputs(first)
    for _ in range(DEFAULT_PROFILE_RUNS):
        traced.invoke()
    folder = tempfile.mkdtemp(prefix="edgetk-etdump-")
    dump = os.path.join(folder, "run.etdp")
    traced.program.write_etdump_result_to_file(dump, os.path.join(folder, "debug.bin"))
    from executorch.devtools import Inspector

    inspector = Inspector(etdump_path=dump)
    per_op = {}  # type: dict
    for block in inspector.event_blocks:
        if block.name != "Execute":  # "Default" holds the load (Program::load_method, Method::init)
            continue
        for event in block.events:
            times = [t for t in (event.perf_data.raw if event.perf_data else [])]
            if not times or event.name == "Method::execute":
                continue
            entry = per_op.setdefault(event.name, {"name": event.name, "calls": 0, "total_ms": 0.0})
            entry["calls"] += len(times)
            entry["total_ms"] += sum(times)
    ops = sorted(per_op.values(), key=lambda e: -e["total_ms"])
    for entry in ops:
        entry["mean_ms"] = round(entry["total_ms"] / entry["calls"], 5)
        entry["total_ms"] = round(entry["total_ms"], 4)
    # XNNPACK's own operators (``Convolution (NHWC, QC8) IGEMM #1``) run inside DELEGATE_CALL: both are listed
    return {"available": True, "source": "etdump", "runs": DEFAULT_PROFILE_RUNS, "top": ops[:top]}


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


class OnnxModel(object):
    """One ONNX Runtime session. ``profile_prefix`` turns ORT's profiler on (a separate session from the timed
    one); ``optimized_out`` writes the graph-optimized model there while loading; ``optimization="disable"``
    loads an already optimized file without optimizing again; ``cache_dir`` holds TensorRT engines."""

    format = "onnx"

    def __init__(self, version, path, threads, wanted_providers, record, profile_prefix=None, optimized_out=None,
                 optimization=None, cache_dir=None, tuning=None):
        # type: (Any, str, int, list, dict, Any, Any, Any, Any, Any) -> None
        import onnxruntime as ort

        numpy = _import_numpy()
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
    _import_numpy()
    missing = []
    for runtime in candidates:
        t0 = time.perf_counter()
        try:
            if fmt == "onnx":
                import onnxruntime  # noqa: F401
                interpreter_cls = None
            elif fmt == "pte":
                native = native_pte_runner()
                pte_version_lock(record, _dist_version("executorch"))
                if native is None:
                    import executorch.runtime  # noqa: F401 (imports torch too: part of import_ms)
                interpreter_cls = None
            else:
                interpreter_cls = _load_tflite_interpreter(runtime)
        except ImportError as exc:
            if _NUMPY_ABI in str(exc) or MEMORY_WORDS.search(str(exc)):
                raise classify_load_error(exc, runtime, _version_of(runtime))
            missing.append("{} ({})".format(runtime, str(exc).splitlines()[0] if str(exc) else "not installed"))
            continue
        version = _version_of(runtime)
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


# ------------------------------------------------------------------------------------------ accelerators


EDGETPU_LIBRARY = "libedgetpu.so.1"
EDGETPU_CUSTOM_OP = "edgetpu-custom-op"
EDGETPU_HINT = ("Install the Edge TPU runtime and plug in the Coral: add Coral's apt repository "
                "(https://coral.ai/docs/accelerator/get-started/), then `sudo apt-get install libedgetpu1-std`. "
                "The bundle's CPU artifacts are measured without it.")
DELEGATE_NODE = "DELEGATE"  # the op name the interpreter gives a node that a delegate kernel took over
XNNPACK = "XNNPACK"
CPU_PROVIDER = "CPUExecutionProvider"
TFLITE_TIMES_NOTE = ("{} {}'s Python interpreter exposes no per-operator timer (TFLite's op profiling lives in the "
                     "C++ benchmark_model tool): reported are each node's operator and whether the delegate took "
                     "it, read from the graph after delegation; times per operator and the time share on the "
                     "delegate are unknown.")


def tflite_delegate_library(record):
    # type: (dict) -> Any
    """The delegate library an artifact needs: the manifest's ``delegate``, or libedgetpu for *_edgetpu.tflite."""
    library = record.get("delegate")
    if isinstance(library, str) and library:
        return library
    if str(record.get("file", "")).endswith("_edgetpu.tflite"):
        return EDGETPU_LIBRARY
    return None


def intended_placement(record, fmt):
    # type: (dict, str) -> str
    """Where the artifact is meant to run: a delegate (edgetpu, a library name), XNNPACK, or an ORT provider."""
    if fmt == "pte":
        return XNNPACK
    if fmt == "onnx":
        for name in record.get("execution_providers") or []:
            if isinstance(name, str):
                return name
        return CPU_PROVIDER
    library = tflite_delegate_library(record)
    if library is None:
        return XNNPACK
    for place in ("edgetpu", "gpu"):
        if place in library.lower():
            return place
    return os.path.basename(library)


def load_tflite_delegate(runtime, version, library):
    # type: (str, Any, str) -> Any
    """``load_delegate(library)`` of the runtime in use; a missing library or device is ``missing_runtime``."""
    if runtime == "litert":
        from ai_edge_litert.interpreter import load_delegate
    elif runtime == "tflite-runtime":
        from tflite_runtime.interpreter import load_delegate
    else:
        import tensorflow as tf

        load_delegate = tf.lite.experimental.load_delegate
    try:
        return load_delegate(library)
    except Exception as exc:  # OSError: no such library; ValueError: the library found no device
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        hint = EDGETPU_HINT if "edgetpu" in library else (
            "Install {} on the device (the delegate's own package), or use an artifact without a delegate."
            .format(library))
        raise RunnerError("missing_runtime", "{} {} could not load the delegate {} ({}).".format(
            runtime, version or "", library, text), hint)


def tflite_nodes(interpreter):
    # type: (Any) -> Any
    """[(index, op, inputs, outputs)] of every node the interpreter holds, or None where the runtime hides them.

    After ``allocate_tensors`` the list holds the model's own nodes first, then one ``DELEGATE`` node per
    partition a delegate took (XNNPACK by default, a loaded delegate such as the Edge TPU's).
    """
    wrapper = getattr(interpreter, "_interpreter", None)
    if wrapper is None or not hasattr(wrapper, "NumNodes"):
        return None
    nodes = []
    for index in range(int(wrapper.NumNodes())):
        nodes.append((index, str(wrapper.NodeName(index)), [int(t) for t in wrapper.NodeInputs(index)],
                      [int(t) for t in wrapper.NodeOutputs(index)]))
    return nodes


def delegated_nodes(nodes):
    # type: (list) -> dict
    """{own node index: delegate node index} for each model node inside a delegate's partition: walk back from
    each DELEGATE node's outputs through the producers until its inputs (the partition's boundary)."""
    producer = {}  # type: dict
    for index, op, _, outs in nodes:
        if op != DELEGATE_NODE:
            for tensor in outs:
                producer[tensor] = index
    by_index = dict((n[0], n) for n in nodes)
    taken = {}  # type: dict
    for index, op, ins, outs in nodes:
        if op != DELEGATE_NODE:
            continue
        boundary = set(ins)
        stack = list(outs)
        seen = set()  # type: set
        while stack:
            tensor = stack.pop()
            if tensor < 0 or tensor in seen or tensor in boundary:
                continue
            seen.add(tensor)
            node = producer.get(tensor)
            if node is None or node in taken:
                continue
            taken[node] = index
            stack.extend(by_index[node][2])
    return taken


def _tensor_name(interpreter, index):
    # type: (Any, int) -> Any
    wrapper = interpreter._interpreter
    for args in ((index, 0), (index,)):
        try:
            return str(wrapper.TensorName(*args))
        except TypeError:
            continue
        except Exception:
            return None
    return None


def tflite_graph_profile(interpreter, intended, runtime, version, top):
    # type: (Any, str, str, Any, int) -> tuple
    """(placement, profile) of a TFLite interpreter from its graph after delegation (no times: see the note)."""
    nodes = tflite_nodes(interpreter)
    note = TFLITE_TIMES_NOTE.format(runtime, version)
    if nodes is None:
        missing = "{} {} does not expose the interpreter's nodes; placement is unknown.".format(runtime, version)
        return (placement_record(intended, None, None, None, [], "none", missing),
                {"available": False, "note": missing, "by_op_type": [], "top_nodes": []})
    own = [n for n in nodes if n[1] != DELEGATE_NODE]
    taken = delegated_nodes(nodes)
    on_ids = set(i for i in taken if intended != "edgetpu" or nodes[i][1] == EDGETPU_CUSTOM_OP)
    executor = {}  # type: dict
    for index, op, _, _ in own:
        if index in on_ids:
            executor[index] = intended
        elif index in taken:
            executor[index] = XNNPACK
        else:
            executor[index] = "cpu"
    fallback = [n for n in own if n[0] not in on_ids]
    if intended == "edgetpu":
        note += (" On the Edge TPU each edgetpu-custom-op node holds every operator the compiler mapped to the "
                 "TPU (edgetpu_compiler.log lists them); the other nodes run on the CPU.")
    placement = placement_record(intended, len(own), len(own) - len(fallback), None,
                                 [n[1] for n in fallback], "graph", note)
    by_type = {}  # type: dict
    for index, op, _, _ in own:
        entry = by_type.setdefault(op, {"op_type": op, "nodes": 0, "time_ms": None, "share": None, "on": {}})
        entry["nodes"] += 1
        entry["on"][executor[index]] = entry["on"].get(executor[index], 0) + 1
    listed = []
    ordered = [n for n in own if executor[n[0]] != intended] + [n for n in own if executor[n[0]] == intended]
    for index, op, _, outs in ordered[:top]:
        listed.append({"name": _tensor_name(interpreter, outs[0]) if outs else None, "op_type": op,
                       "on": executor[index], "time_ms": None, "share": None})
    profile = {
        "available": False,
        "note": note,
        "runs": 0,
        "total_ms": None,
        "overhead": None,
        "by_op_type": sorted(by_type.values(), key=lambda e: (-e["nodes"], e["op_type"])),
        "top_nodes": listed,
    }
    return placement, profile


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


# ------------------------------------------------------------------------------------------ measuring


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


def _prepare(numpy, tensor, array):
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


def _dequantize(numpy, tensor, array):
    # type: (Any, Tensor, Any) -> Any
    array = numpy.asarray(array)
    if tensor.quantized:
        return (array.astype(numpy.float32) - tensor.zero_point) * numpy.float32(tensor.scale)
    return array.astype(numpy.float32)


def _order(tensors, specs):
    # type: (list, Any) -> list
    """The runtime's tensors in the manifest's order (by name where the names match, else as loaded)."""
    names = [s.get("name") for s in specs or [] if isinstance(s, dict)]
    by_name = dict((t.name, t) for t in tensors)
    if names and len(names) == len(tensors) and all(n in by_name for n in names):
        return [by_name[n] for n in names]
    return list(tensors)


def _load_npz(numpy, path, prefix):
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
    if not isinstance(golden, dict) or not _safe_name(golden.get("outputs")):
        return None
    expected = _load_npz(numpy, os.path.join(bundle, golden["outputs"]), "output_")
    atol = float(golden.get("atol") or 0.0)
    inputs = _order(model.inputs, record.get("inputs"))
    outputs = _order(model.outputs, record.get("outputs"))
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
        model.set_inputs([(t, _prepare(numpy, t, g[i])) for t, g in zip(inputs, golden_inputs)])
        got = dict((t.key, a) for t, a in zip(model.outputs, model.invoke()))
        for k, tensor in enumerate(outputs):
            actual = _dequantize(numpy, tensor, got[tensor.key])
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
    }
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
    valid = isinstance(checks, list) and _safe_name(golden.get("reference")) and all(
        isinstance(c, dict) and isinstance(c.get("output"), int) and 0 <= c["output"] < outputs
        and isinstance(c.get("axis"), int) and isinstance(c.get("runs"), list)
        and isinstance(c.get("float_range"), (int, float)) and c["float_range"] > 0
        and isinstance(c.get("max_error"), (int, float)) for c in checks)
    if not valid:
        raise RunnerError("bad_bundle", "The golden slice checks in manifest.json are malformed.", REDEPLOY_HINT)
    reference = _load_npz(numpy, os.path.join(bundle, golden["reference"]), "output_")
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


def _peak_rss_mb():
    # type: () -> Any
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, AttributeError):
        return None
    return round(rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0, 1)


# ------------------------------------------------------------------------------------------ loads


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


# ------------------------------------------------------------------------------------------ throughput


DEFAULT_BATCH_SIZES = (1, 4, 8)
DEFAULT_IN_FLIGHT = (1, 2, 4)


def _stack_inputs(numpy, inputs, samples, batch):
    # type: (Any, list, list, int) -> list
    """[(Tensor, array)] holding ``batch`` golden samples (cycled) along the batch dimension."""
    pairs = []
    for tensor, golden in zip(inputs, samples):
        rows = [_prepare_sample(numpy, tensor, golden[i % len(golden)]) for i in range(batch)]
        pairs.append((tensor, numpy.ascontiguousarray(numpy.concatenate(rows, axis=0))))
    return pairs


def _prepare_sample(numpy, tensor, sample):
    # type: (Any, Tensor, Any) -> Any
    """One golden sample at batch 1 in the tensor's dtype (shape [1, ...] whatever the tensor's batch is)."""
    one = Tensor(tensor.name, [1] + list(tensor.shape[1:]), tensor.dtype, tensor.scale, tensor.zero_point,
                 tensor.key)
    array = _prepare(numpy, one, sample)
    if array.ndim == len(one.shape) - 1:
        array = array[None]
    return array


def _point(batch, in_flight, seconds_per_call, total, wall):
    # type: (int, int, list, int, float) -> dict
    stats = latency_stats(seconds_per_call)
    return {"batch": batch, "in_flight": in_flight, "inferences_per_s": round(total / wall, 3) if wall > 0 else None,
            "latency_ms": {"p50": stats["p50"], "p90": stats["p90"], "mean": stats["mean"]},
            "calls": len(seconds_per_call)}


def measure_throughput(numpy, model, record, samples, opts, reopen):
    # type: (Any, Any, dict, list, Any, Any) -> dict
    """Inferences per second at the batch sizes the artifact allows: a dynamic batch dimension is run at each
    ``--batch-sizes`` value (and each sample's outputs compared with its batch-1 outputs); a fixed batch of 1
    is run with several requests in flight (one interpreter per request for TFLite, one shared session for ORT)."""
    inputs = _order(model.inputs, record.get("inputs"))
    outputs = _order(model.outputs, record.get("outputs"))
    if not samples or len(samples) != len(inputs):
        samples = [numpy.zeros([1] + [d if d > 0 else 1 for d in t.shape[1:]], "float32") for t in inputs]
        samples = [s[None] for s in samples]
    runs = max(5, getattr(opts, "throughput_runs", 0) or opts.runs)
    min_time = getattr(opts, "throughput_time", 0.0) or 0.0
    if model.dynamic_batch():
        sizes = sorted(set(getattr(opts, "batch_sizes", None) or DEFAULT_BATCH_SIZES))
        biggest = max(sizes)
        reference = []  # type: list
        for i in range(biggest):
            model.set_inputs([(t, _prepare_sample(numpy, t, g[i % len(g)])) for t, g in zip(inputs, samples)])
            got = dict((t.key, a) for t, a in zip(model.outputs, model.invoke()))
            reference.append([_dequantize(numpy, t, got[t.key]) for t in outputs])
        step = max([t.scale for t in outputs if t.quantized] or [0.0])
        golden = record.get("golden") if isinstance(record.get("golden"), dict) else {}
        tolerance = max(float(golden.get("atol") or 0.0), 1e-4) + step * 1.0001
        points = []
        matches = []
        for batch in sizes:
            model.resize_batch(batch)
            model.set_inputs(_stack_inputs(numpy, inputs, samples, batch))
            got = dict((t.key, a) for t, a in zip(model.outputs, model.invoke()))
            worst = 0.0
            for k, tensor in enumerate(outputs):
                out = _dequantize(numpy, tensor, got[tensor.key])
                for i in range(batch):
                    want = reference[i][k].reshape(-1)
                    row = out[i].reshape(-1)
                    if row.size != want.size:
                        worst = float("inf")
                        continue
                    worst = max(worst, float(numpy.max(numpy.abs(row - want))) if want.size else 0.0)
            matches.append({"batch": batch, "max_abs_error": worst, "ok": worst <= tolerance})
            model.invoke()
            calls = model.timed_loop(max(5, runs // batch), min_time)
            points.append(_point(batch, 1, calls, batch * len(calls), sum(calls)))
        model.resize_batch(1)
        return {"mode": "batch", "points": points, "per_sample": {"tolerance": tolerance, "checks": matches,
                                                                  "ok": all(m["ok"] for m in matches)}}
    import threading

    levels = sorted(set(getattr(opts, "in_flight", None) or DEFAULT_IN_FLIGHT))
    first = [(t, _prepare_sample(numpy, t, g[0])) for t, g in zip(inputs, samples)]
    points = []
    for level in levels:
        workers = reopen(level)  # [(model, set_inputs done)] one per request in flight
        per_worker = max(3, runs // level)
        times = [[] for _ in workers]  # type: list
        spans = [None] * len(workers)  # type: list
        barrier = threading.Barrier(len(workers))
        errors = []  # type: list

        def work(slot, worker):
            # type: (int, Any) -> None
            try:
                worker.set_inputs([(_match(worker, t), a) for t, a in first])
                worker.invoke()
                barrier.wait()
                clock = time.perf_counter
                begin = clock()
                for _ in range(per_worker):
                    t0 = clock()
                    worker.invoke()
                    times[slot].append(clock() - t0)
                spans[slot] = (begin, clock())
            except Exception as exc:  # reported below, not lost in a thread
                errors.append(exc)
                try:
                    barrier.abort()
                except Exception:
                    pass

        threads = [threading.Thread(target=work, args=(i, w)) for i, w in enumerate(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        wall = max(s[1] for s in spans) - min(s[0] for s in spans)  # first request in to last one out
        flat = [t for ts in times for t in ts]
        points.append(_point(1, level, flat, len(flat), wall))
    return {"mode": "in_flight", "points": points, "per_sample": None}


def _match(worker, tensor):
    # type: (Any, Tensor) -> Tensor
    """The worker's own tensor with the name of ``tensor`` (each interpreter has its own tensor indices)."""
    for own in worker.inputs:
        if own.name == tensor.name:
            return own
    return tensor


# ------------------------------------------------------------------------------------------ inside a run


DEFAULT_PROFILE_TOP = 10
DEFAULT_PROFILE_RUNS = 20
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
LOAD_ROUNDS = 3  # fresh processes per side for the session options, interleaved; medians are reported
LOAD_VARIANTS = ("default", "ort-optimized-write", "ort-optimized", "litert-compiled", "xnnpack-cache") + tuple(
    v for v, _, _ in ORT_TUNINGS)


def onnx_session_options(opts, record, fmt):
    # type: (Any, dict, str) -> Any
    """Options every ONNX session of this artifact gets: the device cache directory (TensorRT engines)."""
    if fmt != "onnx":
        return None
    return {"cache_dir": artifact_cache_dir(opts, record, make=False)}


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


class CompiledTFLite(object):
    """LiteRT's CompiledModel API: used here only to measure XNNPACK's weight cache, which the Interpreter API
    of ai-edge-litert 2.3 does not offer (``CpuOptions.xnnpack_weight_cache_path``)."""

    format = "tflite"

    def __init__(self, path, threads, weight_cache):
        # type: (str, int, Any) -> None
        t0 = time.perf_counter()
        try:
            from ai_edge_litert.compiled_model import CompiledModel
            from ai_edge_litert.hardware_accelerator import HardwareAccelerator
            from ai_edge_litert.options import Options
        except ImportError as exc:
            raise RunnerError("missing_runtime", "LiteRT's CompiledModel API is not available here ({}).".format(
                exc), "pip install -U ai-edge-litert")
        t1 = time.perf_counter()
        numpy = _import_numpy()
        options = Options()
        options.hardware_accelerators = HardwareAccelerator.CPU
        options.cpu_options.num_threads = threads
        if weight_cache:
            options.cpu_options.xnnpack_weight_cache_path = weight_cache
        self.model = CompiledModel.from_file(path, options=options)
        signature = sorted(self.model.get_signature_list())[0]
        details = sorted(self.model.get_input_tensor_details(signature).values(), key=lambda d: d.get("index", 0))
        self.inputs = [Tensor(d["name"], [int(x) for x in d["shape"]], numpy.dtype(d["dtype"]), 0.0, 0, k)
                       for k, d in enumerate(details)]
        self.in_buffers = self.model.create_input_buffers(0)
        self.out_buffers = self.model.create_output_buffers(0)
        self.import_ms = round((t1 - t0) * 1000.0, 3)
        self.load_ms = round((time.perf_counter() - t1) * 1000.0, 3)
        self.runtime = "litert"
        self.extra = {"api": "CompiledModel"}

    def set_inputs(self, pairs):
        # type: (list) -> None
        for tensor, array in pairs:
            self.in_buffers[tensor.key].write(array)

    def invoke(self):
        # type: () -> list
        self.model.run_by_index(0, self.in_buffers, self.out_buffers)
        return []


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
    inputs = _order(model.inputs, record.get("inputs"))
    if golden_inputs and len(golden_inputs) == len(inputs):
        first = [(t, _prepare(numpy, t, g[0])) for t, g in zip(inputs, golden_inputs)]
    else:
        first = [(t, _prepare(numpy, t, numpy.zeros([d if d > 0 else 1 for d in t.shape], "float32")))
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


def measure_loads(bundle, name, opts, main_report, fmt):
    # type: (str, str, Any, dict, str) -> dict
    """Cold, warm and with-each-load-option loads of one artifact, each in a fresh process (a load in the
    process that already loaded the artifact would find the runtime's own caches warm)."""

    def one(*args):
        # type: (*str) -> dict
        child = _child(bundle, name, opts, extra=("--load-only",) + args)
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
        record = _find_record(manifest, name)
        threads = opts.threads or _default_threads(manifest, record)
        report["threads"] = threads
        if verify:
            verify_artifact(bundle, record)
        fmt = _artifact_format(record)
        numpy = _import_numpy()
        golden_name = manifest.get("golden_inputs") or "golden/inputs.npz"
        golden_inputs = []  # type: list
        if _safe_name(golden_name) and os.path.isfile(os.path.join(bundle, golden_name)):
            golden_inputs = _load_npz(numpy, os.path.join(bundle, golden_name), "input_")
        path = os.path.join(bundle, name)
        if getattr(opts, "load_only", False):
            report.update(measure_load(numpy, path, fmt, record, threads, opts, golden_inputs))
            report["peak_rss_mb"] = _peak_rss_mb()
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
        report["peak_rss_mb"] = _peak_rss_mb()  # before profiling and throughput open sessions of their own
        if isinstance(model, NativePteModel):  # the program's process, not this Python's
            report["runner_peak_rss_mb"] = report["peak_rss_mb"]
            report["peak_rss_mb"] = model.peak_rss_mb()
        inspect_artifact(numpy, model, path, fmt, record, threads, opts, first, times, golden_inputs, report)
    except RunnerError as exc:
        report["peak_rss_mb"] = _peak_rss_mb()
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


def _find_record(manifest, name):
    # type: (dict, str) -> dict
    for record in manifest["artifacts"]:
        if record.get("file") == name:
            return record
    raise RunnerError("usage", "The bundle has no artifact {} (it has: {}).".format(
        name, ", ".join(str(a.get("file")) for a in manifest["artifacts"])))


def _signal_name(number):
    # type: (int) -> str
    try:
        return signal.Signals(number).name
    except ValueError:
        return "signal {}".format(number)


def _forwarded(opts):
    # type: (argparse.Namespace) -> list
    """The options of ``check`` that its ``run-one`` children take too."""
    args = []  # type: list
    for flag in ("profile", "throughput"):
        if getattr(opts, flag, False):
            args.append("--" + flag)
    for flag, dest in (("--profile-top", "profile_top"), ("--profile-runs", "profile_runs"),
                       ("--batch-sizes", "batch_sizes"), ("--in-flight", "in_flight"), ("--cache-dir", "cache_dir")):
        value = getattr(opts, dest, None)
        if value is not None:
            args += [flag, ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)]
    return args


def _worker_cmd(command, bundle, names, opts, extra=()):
    # type: (str, str, list, argparse.Namespace, tuple) -> list
    """The command line of a worker (``run-one`` or ``run-group``) for ``names`` with ``check``'s options."""
    cmd = [sys.executable, os.path.abspath(__file__), command, "--bundle", bundle]
    for name in names:
        cmd += ["--artifact", name]
    cmd += ["--runs", str(opts.runs), "--warmup", str(opts.warmup), "--min-time", str(opts.min_time),
            "--timeout", str(opts.timeout), "--skip-verify"]
    if opts.threads:
        cmd += ["--threads", str(opts.threads)]
    if opts.runtime:
        cmd += ["--runtime", opts.runtime]
    if getattr(opts, "cold", False) and not extra:
        cmd.append("--cold")
    return cmd + _forwarded(opts) + list(extra)


def _worker_report(name, opts, returncode, stdout, tail, timed_out, seconds, oom=None):
    # type: (str, argparse.Namespace, Any, str, str, bool, float, Any) -> dict
    """The report a worker printed for ``name``, or what its fate says: killed after ``seconds``, out of memory
    (``oom``: whether the kernel's OOM-kill count rose while it ran, None: unknown; or its stderr says so),
    killed by a signal (the runtime crashed on this artifact), or ended without a report."""
    report = empty_report(name, opts.threads, opts.runs, opts.warmup)
    path = os.path.join(os.path.abspath(os.path.expanduser(opts.bundle)), name)
    killed = returncode is not None and returncode < 0 and -returncode == getattr(signal, "SIGKILL", 9)
    if returncode and not timed_out and (killed and oom or MEMORY_WORDS.search(tail or "")):
        how = ("the worker was killed by SIGKILL and the kernel's OOM-kill count rose" if killed and oom else
               "the worker ended with {}: {}".format(
                   "signal " + _signal_name(-returncode) if returncode < 0 else "exit code {}".format(returncode),
                   MEMORY_WORDS.search(tail).group(0)))
        report["error"] = out_of_memory(name, path, how, _children_peak_mb())
        report["error"]["detail"] = tail or None
        return report
    if killed and not timed_out:
        report["error"] = RunnerError(
            "killed",
            "The worker measuring {} was killed by SIGKILL, {}.".format(
                name, "not by the kernel's out-of-memory killer (its OOM-kill count did not rise)" if oom is False
                else "and the kernel's OOM-kill count cannot be read here"),
            "Something on the device killed it (a watchdog, a supervisor, a container's memory limit); look at "
            "`dmesg` and the system journal.", detail=tail or None).to_dict()
        return report
    if timed_out:
        report["error"] = RunnerError(
            "crash", "Measuring {} did not finish within {:g} s; the worker was killed.".format(name, seconds),
            "Lower --runs/--min-time, or raise --timeout if the device is this slow.").to_dict()
        return report
    if returncode is not None and returncode < 0:
        report["error"] = RunnerError(
            "crash",
            "The worker measuring {} was killed by {} (the runtime crashed on this artifact).".format(
                name, _signal_name(-returncode)),
            "Try another runtime (--runtime) or another artifact of the bundle; the stderr tail is in 'detail'.",
            detail=tail or None).to_dict()
        return report
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and parsed.get("artifact") == name:
            return parsed
    report["error"] = RunnerError(
        "crash", "The worker measuring {} exited with code {} without a report.".format(name, returncode),
        "Run `python3 edgetk_runner.py run-one --bundle DIR --artifact {}` on the device to see why.".format(
            name), detail=tail or None).to_dict()
    return report


def _child(bundle, name, opts, extra=()):
    # type: (str, str, argparse.Namespace, tuple) -> dict
    """Run ``run-one`` for one artifact in a child process and turn its fate into a report."""
    cmd = _worker_cmd("run-one", bundle, [name], opts, extra)
    cgroup = own_cgroup()
    before = oom_kills(cgroup)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              timeout=opts.timeout)
    except subprocess.TimeoutExpired:
        return _worker_report(name, opts, None, "", "", True, opts.timeout)
    return _worker_report(name, opts, proc.returncode, proc.stdout, (proc.stderr or "")[-1500:], False, 0.0,
                          oom_rose(before, oom_kills(cgroup)) if proc.returncode else None)


# The formats whose runtime import dominates a worker's life (ExecuTorch's Python runtime imports torch: 6-10 s on
# an x86 host, 43-55 s under qemu): their artifacts share one import per check (run-group). TFLite and ONNX Runtime
# import in 0.1-1 s and keep a fresh process per artifact.
SHARED_IMPORT_FORMATS = ("pte",)
_FORKED = []  # type: list  # the pid of run-group's current child, for its SIGTERM handler


def import_runtime(fmt):
    # type: (str) -> Any
    """Import the runtime of ``fmt`` (and numpy) in this process; the milliseconds it took, None when it failed
    (each artifact's worker then imports again and reports the failure as its own, ``missing_runtime`` etc.)."""
    t0 = time.perf_counter()
    try:
        _import_numpy()
        if fmt == "pte" and native_pte_runner() is None:
            import executorch.runtime  # noqa: F401 (imports torch)
    except Exception:
        return None
    return round((time.perf_counter() - t0) * 1000.0, 3)


def _json_bytes(doc):
    # type: (Any) -> bytes
    return (json.dumps(_finite(doc), sort_keys=False, allow_nan=False, default=str) + "\n").encode("utf-8")


def framed(data):
    # type: (bytes) -> bytes
    """``data`` (one JSON document, ASCII) in check's frame: ``REPORT_MARK LENGTH SHA256`` on a line of its own,
    the document, ``REPORT_MARK-end`` on a line of its own. The host takes a report only from a whole frame
    whose length and sha256 agree (toolkit.model.runner_frame)."""
    import hashlib

    head = "{} {} {}\n".format(REPORT_MARK, len(data), hashlib.sha256(data).hexdigest()).encode("ascii")
    return head + data + (REPORT_MARK + "-end\n").encode("ascii")


def _write_all(fd, data):
    # type: (int, bytes) -> None
    while data:
        data = data[os.write(fd, data):]


def _forked(bundle, name, opts):
    # type: (str, str, argparse.Namespace) -> dict
    """``run_one`` of one artifact in a child forked from this process, its report read from a pipe. The child
    starts where every other artifact's child starts (the runtime imported, nothing loaded): its ``load_ms`` is a
    first load and its ``peak_rss_mb`` its own (a forked process's ru_maxrss starts at the pages it maps, not at
    the parent's peak). A crash or a hang past --timeout ends that child only and is reported like ``_child``'s."""
    import select
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    log = tempfile.TemporaryFile()  # the child's stderr: the tail of a crash goes into its report
    cgroup = own_cgroup()
    before = oom_kills(cgroup)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, write the report, leave without the parent's exit handlers
        try:
            os.close(read_end)
            os.dup2(log.fileno(), 2)
            os.dup2(2, 1)
            _write_all(write_end, _json_bytes(run_one(bundle, name, opts, verify=not opts.skip_verify)))
        finally:
            os._exit(0)
    _FORKED[:] = [pid]
    os.close(write_end)
    chunks, timed_out, deadline = [], False, time.monotonic() + opts.timeout  # type: (list, bool, float)
    while True:
        ready = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))[0]
        chunk = os.read(read_end, 1 << 16) if ready else b""
        if not ready:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    status = os.waitpid(pid, 0)[1]
    _FORKED[:] = []
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    log.close()
    sys.stderr.write(text)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return _worker_report(name, opts, code, b"".join(chunks).decode("utf-8", "replace"), text[-1500:],
                          timed_out, opts.timeout, oom_rose(before, oom_kills(cgroup)) if code else None)


def run_group(bundle, names, opts, emit):
    # type: (str, list, argparse.Namespace, Any) -> None
    """Import the artifacts' runtime once, then measure each artifact in a child forked from this process
    (:func:`_forked`), emitting its report as soon as it ends. Each report carries ``import_ms`` (the one import,
    measured here) and ``worker`` (what the artifacts shared)."""

    def stop(signum, frame):
        # type: (int, Any) -> None
        for pid in _FORKED:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        formats = set(_artifact_format(_find_record(read_manifest(bundle), name)) for name in names)
    except RunnerError:  # each artifact's child reports it
        formats = set()
    import_ms = import_runtime(formats.pop()) if len(formats) == 1 else None
    worker = {"process": "forked", "artifacts": list(names), "import_ms": import_ms,
              "import_peak_rss_mb": _peak_rss_mb()}
    for name in names:
        report = _forked(bundle, name, opts)
        if import_ms is not None and (report.get("runtime") or {}).get("name"):
            report["import_ms"] = import_ms  # the child found the runtime imported: the import is this one
        report["worker"] = worker
        emit(report)


def _group_children(bundle, names, opts):
    # type: (str, list, argparse.Namespace) -> dict
    """``run-group`` of ``names`` in one child process: name -> report. The group's own deadline is --timeout per
    artifact plus one for the import; reports it printed before it died or was stopped are kept."""
    seconds = opts.timeout * (len(names) + 1)
    cgroup = own_cgroup()
    before = oom_kills(cgroup)
    proc = subprocess.Popen(_worker_cmd("run-group", bundle, names, opts), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.terminate()  # its SIGTERM handler kills the artifact's child it forked
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    found = {}  # type: dict
    for line in (out or "").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("artifact") in names:
            found[doc["artifact"]] = doc
    tail = (err or "")[-1500:]
    oom = oom_rose(before, oom_kills(cgroup)) if proc.returncode else None
    return dict((name, found.get(name) or _worker_report(name, opts, proc.returncode, "", tail, timed_out, seconds,
                                                         oom))
                for name in names)


def check(opts):
    # type: (argparse.Namespace) -> dict
    doc = {"runner_version": RUNNER_VERSION, "ok": False, "environment": environment(), "reports": [],
           "error": None}  # type: Any
    note_memory()
    bundle = os.path.abspath(os.path.expanduser(opts.bundle))
    try:
        manifest = read_manifest(bundle)
        names = opts.artifact or [a["file"] for a in manifest["artifacts"]]
        for name in names:
            _find_record(manifest, name)
    except RunnerError as exc:
        doc["error"] = exc.to_dict()
        return doc
    if not names:
        doc["error"] = RunnerError("bad_bundle", "manifest.json in {} lists no artifacts.".format(bundle),
                                   "Rebuild the bundle with `edgetk convert`.").to_dict()
        return doc
    failed = {}  # type: dict
    for name in names:
        record = _find_record(manifest, name)
        try:
            verify_artifact(bundle, record)
        except RunnerError as exc:
            failed[name] = empty_report(name, opts.threads or _default_threads(manifest, record), opts.runs,
                                        opts.warmup)
            failed[name]["error"] = exc.to_dict()
    grouped = {}  # type: dict
    for fmt in SHARED_IMPORT_FORMATS if hasattr(os, "fork") else ():
        group = [n for i, n in enumerate(names) if n not in failed and n not in names[:i]
                 and _artifact_format(_find_record(manifest, n)) == fmt]
        if group:
            grouped.update(_group_children(bundle, group, opts))
    for name in names:
        record = _find_record(manifest, name)
        if name in failed:
            doc["reports"].append(failed[name])
            continue
        report = dict(grouped[name]) if name in grouped else _child(bundle, name, opts)
        if getattr(opts, "loads", False) and report.get("error") is None:
            report["loads"] = measure_loads(bundle, name, opts, report, _artifact_format(record))
        doc["reports"].append(report)
        note_memory()
    doc["ok"] = all(report_ok(r) for r in doc["reports"])
    return doc


def report_ok(report):
    # type: (dict) -> bool
    """Measured, outputs match, nothing fell off an accelerator it was built for (XNNPACK and the CPU provider
    are the CPU itself: their partial placement is reported, not failed), batched outputs equal per sample."""
    if report.get("error") is not None:
        return False
    if report.get("outputs_match") is not None and not report["outputs_match"].get("ok"):
        return False
    placement = report.get("placement") or {}
    if placement.get("fell_back") and placement.get("intended") not in (XNNPACK, CPU_PROVIDER):
        return False
    per_sample = (report.get("throughput") or {}).get("per_sample") or {}
    return per_sample.get("ok", True) is not False


# ------------------------------------------------------------------------------------------ eval set, layers


EVAL_DIR = "eval"  # bundle folder of the eval set the host pushes for `check --eval`: input_<i>.npy
EVAL_MEMORY_SHARE = 0.25  # a chunk of eval inputs and outputs may take this share of the available memory
EVAL_MAX_CHUNK = 4096


def available_memory_bytes():
    # type: () -> Any
    """MemAvailable from /proc/meminfo (None where it is missing)."""
    match = re.search(r"MemAvailable:\s+(\d+)\s+kB", probe_read("/proc/meminfo") or "")
    return int(match.group(1)) * 1024 if match else None


def eval_chunk(sample_bytes, total, requested=None):
    # type: (int, int, Any) -> int
    """Samples per chunk: ``requested``, else what fits in a quarter of the available memory (inputs read from
    their memory-mapped files plus the outputs of the chunk), at least 1."""
    if requested:
        return max(1, min(int(requested), total))
    free = available_memory_bytes()
    if not free:
        return max(1, min(64, total))
    return max(1, min(total, EVAL_MAX_CHUNK, int(free * EVAL_MEMORY_SHARE) // max(1, sample_bytes)))


def _eval_inputs(numpy, bundle, manifest):
    # type: (Any, str, dict) -> list
    """The pushed eval inputs (``eval/input_<i>.npy`` as manifest.json records them), each checked against its
    sha256, memory-mapped."""
    found = [re.match(r"^" + EVAL_DIR + r"/input_(\d+)\.npy$", str(e.get("file")))
             for e in manifest.get("on_demand") or [] if isinstance(e, dict)]
    names = [m.group(0) for m in sorted((m for m in found if m), key=lambda m: int(m.group(1)))]
    if not names:
        raise RunnerError("bad_bundle", "manifest.json in {} records no eval set (eval/input_<i>.npy).".format(
            bundle), "Convert with --device-eval N, then run `edgetk check --eval` (it pushes the eval set).")
    paths = [on_demand_file(bundle, manifest, n) for n in names]
    try:
        return [numpy.load(p, mmap_mode="r", allow_pickle=False) for p in paths]
    except (OSError, IOError, ValueError) as exc:
        raise RunnerError("bad_bundle", "Cannot read the eval set ({}).".format(exc), REDEPLOY_HINT)


def _artifact_command(opts, what, body):
    # type: (argparse.Namespace, str, Any) -> dict
    """One artifact of the bundle, verified, handed to ``body(numpy, bundle, manifest, record, fmt, doc)``,
    which fills ``doc``; errors become the document's ``error``."""
    bundle = os.path.abspath(os.path.expanduser(opts.bundle))
    name = opts.artifact[0]
    doc = {"runner_version": RUNNER_VERSION, "ok": False, "artifact": name, "error": None}  # type: Any
    try:
        manifest = read_manifest(bundle)
        record = _find_record(manifest, name)
        verify_artifact(bundle, record)
        body(_import_numpy(), bundle, manifest, record, _artifact_format(record), doc)
        doc["ok"] = doc["error"] is None
    except RunnerError as exc:
        doc["error"] = exc.to_dict()
    except Exception as exc:
        doc["error"] = RunnerError("crash", "{} {} failed ({}: {}).".format(
            what, name, type(exc).__name__, str(exc)[:300]), None,
            detail="".join(traceback.format_exc(limit=8))[-2000:]).to_dict()
    return doc


def run_eval(opts):
    # type: (argparse.Namespace) -> dict
    """Every eval sample through one artifact, in chunks sized to this device's memory; the raw outputs (in the
    artifact's own dtype: int8 outputs stay one byte a value) go to ``--out``/output_<k>.npy, their scale and
    zero point to the JSON, so the host dequantizes and scores them."""
    def body(numpy, bundle, manifest, record, fmt, doc):
        # type: (Any, str, dict, dict, str, dict) -> None
        name = record["file"]
        threads = opts.threads or _default_threads(manifest, record)
        data = _eval_inputs(numpy, bundle, manifest)
        model = open_model(os.path.join(bundle, name), fmt, record, threads, opts.runtime)
        inputs = _order(model.inputs, record.get("inputs"))
        outputs = _order(model.outputs, record.get("outputs"))
        if len(data) != len(inputs):
            raise RunnerError("bad_bundle", "The eval set has {} inputs; {} has {}.".format(
                len(data), name, len(inputs)), "Convert the bundle again.")
        total = min(len(d) for d in data)
        out_dir = os.path.abspath(os.path.expanduser(opts.out))
        if not os.path.isdir(out_dir):
            os.makedirs(out_dir)
        writers = []  # type: list
        per_sample = sum(int(d[0].nbytes) for d in data) if total else 0
        t0 = time.perf_counter()
        chunk = 0  # sized from the first sample's inputs and outputs
        chunks = 0
        start = 0
        while start < total:
            size = chunk or 1
            block = [numpy.array(d[start:start + size]) for d in data]  # one chunk in memory at a time
            chunks += 1
            for i in range(len(block[0])):
                model.set_inputs([(t, _prepare(numpy, t, b[i])) for t, b in zip(inputs, block)])
                got = dict((t.key, a) for t, a in zip(model.outputs, model.invoke()))
                values = [numpy.asarray(got[t.key]) for t in outputs]
                if not writers:
                    per_sample += sum(int(v.nbytes) for v in values)
                    chunk = eval_chunk(per_sample, total, opts.chunk)
                    writers = [numpy.lib.format.open_memmap(
                        os.path.join(out_dir, "output_{}.npy".format(k)), mode="w+", dtype=v.dtype,
                        shape=(total,) + tuple(v.shape)) for k, v in enumerate(values)]
                for w, v in zip(writers, values):
                    w[start + i] = v
            start += size
        for w in writers:
            w.flush()
        doc.update({
            "samples": total, "chunk": chunk, "chunks": chunks,
            "seconds": round(time.perf_counter() - t0, 3),
            "runtime": {"name": model.runtime, "version": model.version},
            "outputs": [{"file": "output_{}.npy".format(k), "name": t.name, "dtype": str(numpy.dtype(t.dtype)),
                         "scale": t.scale if t.quantized else None,
                         "zero_point": t.zero_point if t.quantized else None} for k, t in enumerate(outputs)],
        })

    return _artifact_command(opts, "Evaluating", body)


def _tflite_with_tensors(path, threads, forced):
    # type: (str, int, Any) -> Any
    """A TFLite interpreter that keeps every intermediate tensor (``experimental_preserve_all_tensors``, which
    also leaves the default delegate out: XNNPACK would fuse the tensors away)."""
    for runtime in ([forced] if forced else list(TFLITE_RUNTIMES)):
        try:
            cls = _load_tflite_interpreter(runtime)
        except ImportError:
            continue
        interpreter = cls(model_path=path, num_threads=threads, experimental_preserve_all_tensors=True)
        interpreter.allocate_tensors()
        return runtime, interpreter
    raise RunnerError("missing_runtime", "No TFLite runtime is installed on this device.",
                      "pip install ai-edge-litert")


def run_layers(opts):
    # type: (argparse.Namespace) -> dict
    """The golden samples through one artifact with its intermediate tensors exposed; the tensors of its layer
    probe (``layers/<artifact>.probe.json``, pushed by the host) go, dequantized to float16, to the ``--out``
    .npz as ``t_<j>``.

    ONNX: ``layers/<artifact>.debug.onnx`` is a copy of the artifact with those tensors added as graph outputs
    (written at convert time: the device needs no onnx package). Both are checked against manifest.json."""
    def body(numpy, bundle, manifest, record, fmt, doc):
        # type: (Any, str, dict, dict, str, dict) -> None
        name = record["file"]
        try:
            with open(on_demand_file(bundle, manifest, "layers/{}.probe.json".format(name))) as handle:
                wanted = [str(layer["tensor"]) for layer in json.load(handle)["layers"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise RunnerError("bad_bundle", "The layer probe of {} is malformed ({}).".format(name, exc),
                              "Convert the bundle again.")
        golden = _load_npz(numpy, os.path.join(bundle, manifest.get("golden_inputs") or "golden/inputs.npz"),
                           "input_")
        samples = min([opts.samples] + [len(g) for g in golden])
        values = dict((j, []) for j in range(len(wanted)))  # type: dict
        if fmt == "onnx":
            model = OnnxModel(_version_of("onnxruntime"),
                              on_demand_file(bundle, manifest, "layers/{}.debug.onnx".format(name)), 1, [], record)
            known = set(o.name for o in model.session.get_outputs())
            present = [n for n in wanted if n in known]
            inputs = _order(model.inputs, record.get("inputs"))
            for i in range(samples):
                model.set_inputs([(t, _prepare(numpy, t, g[i])) for t, g in zip(inputs, golden)])
                got = dict(zip(present, model.session.run(present, model.feeds)))
                for j, n in enumerate(wanted):
                    if n in got:
                        values[j].append(numpy.asarray(got[n], dtype=numpy.float32))
            runtime = "onnxruntime"
        else:
            runtime, interpreter = _tflite_with_tensors(os.path.join(bundle, name), 1, opts.runtime)
            details = dict((d["name"], d) for d in interpreter.get_tensor_details())
            inputs = _order([TFLiteModel._tensor(d) for d in interpreter.get_input_details()], record.get("inputs"))
            for i in range(samples):
                for t, g in zip(inputs, golden):
                    interpreter.set_tensor(t.key, _prepare(numpy, t, g[i]))
                interpreter.invoke()
                for j, n in enumerate(wanted):
                    d = details.get(n)
                    if d is None:
                        continue
                    try:
                        raw = interpreter.get_tensor(d["index"])
                    except ValueError:  # a tensor the runtime did not keep
                        continue
                    values[j].append(_dequantize(numpy, TFLiteModel._tensor(d), raw))
        arrays = dict(("t_{}".format(j), numpy.stack(v).astype(numpy.float16)) for j, v in values.items()
                      if len(v) == samples and samples)
        out = os.path.abspath(os.path.expanduser(opts.out))
        if not os.path.isdir(os.path.dirname(out)):
            os.makedirs(os.path.dirname(out))
        with open(out, "wb") as handle:
            numpy.savez(handle, **arrays)
        doc.update({"samples": samples, "runtime": runtime,
                    "found": ["t_{}".format(j) in arrays for j in range(len(wanted))]})

    return _artifact_command(opts, "Reading the layers of", body)


# ------------------------------------------------------------------------------------------ CLI


def _finite(value):
    # type: (Any) -> Any
    """JSON has no NaN/Infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return dict((k, _finite(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageFailure(message)


def _positive_int(text):
    # type: (str) -> int
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _int_list(text):
    # type: (str) -> list
    """``1,4,8`` -> [1, 4, 8] (each at least 1)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected integers separated by commas, e.g. 1,4,8")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected integers >= 1 separated by commas, e.g. 1,4,8")
    return values


def _non_negative_float(text):
    # type: (str) -> float
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def selected_model(name, root=None):
    # type: (str, Any) -> str
    """The path of the model file a device should run for the installed bundle ``name``: the artifact the last
    ``edgetk check`` selected on this device (``<home>/bundles/NAME/selected.json``, ``<home>`` the toolkit's home:
    ``root``, else $EDGETK_HOME, else ~/.edgetk), or, when that
    selection is for another version than the installed one or there is none, the manifest's preferred
    artifact (the profile's proposal). In an application: ``path = edgetk_runner.selected_model("NAME")``."""
    bdir = os.path.join(os.path.expanduser(root) if root else toolkit_home(), "bundles", name)
    link = os.path.join(bdir, "current")
    if not os.path.islink(link):
        raise RunnerError("bad_bundle", "the bundle %r is not installed here" % name, "edgetk deploy it first")
    version = os.readlink(link).rstrip("/")
    try:
        with open(os.path.join(bdir, "selected.json")) as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        doc = {}
    if isinstance(doc, dict) and doc.get("version") == version and doc.get("artifact"):
        return os.path.join(bdir, version, doc["artifact"])
    with open(os.path.join(bdir, version, "manifest.json")) as handle:
        artifacts = json.load(handle).get("artifacts") or []
    chosen = next((a for a in artifacts if a.get("preferred")), artifacts[0] if artifacts else None)
    if chosen is None:
        raise RunnerError("bad_bundle", "the bundle %r has no artifacts" % name, "convert it again")
    return os.path.join(bdir, version, chosen["file"])


def build_parser():
    # type: () -> argparse.ArgumentParser
    parser = _Parser(prog="edgetk_runner.py", description="edgetk on-device runner (prints one JSON document)")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("probe", help="describe this device and its runtimes")
    p = sub.add_parser("memory", help="the memory this device has now, and its OOM-kill counts (stdlib only)")
    p.add_argument("--cgroup", default=None, help="the memory cgroup's folder (default: this process's)")
    p = sub.add_parser("selected", help="the path of the model file the last check selected for a bundle")
    p.add_argument("--name", required=True)
    p.add_argument("--root", default=None, help="the toolkit's home (default $EDGETK_HOME, else ~/.edgetk)")
    for command in ("check", "run-one", "run-group"):
        p = sub.add_parser(command, help={
            "check": "measure a bundle's artifacts", "run-one": "measure one artifact in this process",
            "run-group": "import the artifacts' runtime once, measure each in a process forked from this one "
                         "(one JSON line per artifact)"}[command])
        p.add_argument("--bundle", required=True)
        p.add_argument("--artifact", action="append", required=command != "check")
        p.add_argument("--runs", type=_positive_int, default=DEFAULT_RUNS)
        p.add_argument("--warmup", type=_positive_int, default=DEFAULT_WARMUP)
        p.add_argument("--min-time", type=_non_negative_float, default=0.0, dest="min_time")
        p.add_argument("--threads", type=_positive_int, default=None)
        p.add_argument("--runtime", choices=TFLITE_RUNTIMES + ONNX_RUNTIMES + PTE_RUNTIMES, default=None)
        p.add_argument("--timeout", type=_non_negative_float, default=DEFAULT_TIMEOUT)
        p.add_argument("--cold", action="store_true",
                       help="drop the artifact from the page cache before loading it (a load as after a reboot)")
        p.add_argument("--profile", action="store_true", help="per-operator profile and placement per artifact")
        p.add_argument("--profile-top", type=_positive_int, default=DEFAULT_PROFILE_TOP, dest="profile_top")
        p.add_argument("--profile-runs", type=_positive_int, default=DEFAULT_PROFILE_RUNS, dest="profile_runs")
        p.add_argument("--throughput", action="store_true",
                       help="inferences/s at several batch sizes (dynamic batch) or requests in flight")
        p.add_argument("--batch-sizes", type=_int_list, default=None, dest="batch_sizes")
        p.add_argument("--in-flight", type=_int_list, default=None, dest="in_flight")
        p.add_argument("--loads", action="store_true",
                       help="cold, warm and optimized loads, each in a fresh process, with the first inference")
        p.add_argument("--cache-dir", default=None, dest="cache_dir",
                       help="device-side caches (TensorRT engines, optimized models); default <home>/cache")
        if command != "check":
            p.add_argument("--skip-verify", action="store_true")
        if command == "run-one":
            p.add_argument("--load-only", action="store_true", dest="load_only")
            p.add_argument("--load-variant", choices=LOAD_VARIANTS, default=None, dest="load_variant")
            p.add_argument("--fresh-cache", action="store_true", dest="fresh_cache")
    for command in ("eval", "layers"):
        p = sub.add_parser(command, help="the eval set through one artifact" if command == "eval" else
                           "the golden samples through one artifact, intermediate tensors kept")
        p.add_argument("--bundle", required=True)
        p.add_argument("--artifact", action="append", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--threads", type=_positive_int, default=None)
        p.add_argument("--runtime", choices=TFLITE_RUNTIMES + ONNX_RUNTIMES, default=None)
        if command == "eval":
            p.add_argument("--chunk", type=_positive_int, default=None, help="samples per chunk (default: by memory)")
        else:
            p.add_argument("--samples", type=_positive_int, default=2)
    return parser


def main(argv=None):
    # type: (Any) -> int
    out_fd = os.dup(1)
    os.dup2(2, 1)  # whatever a native library prints goes to stderr; the JSON goes to the saved fd
    words = sys.argv[1:] if argv is None else argv
    frame = framed if words[:1] == ["check"] else (lambda data: data)

    def emit(doc):
        # type: (dict) -> None
        sys.stdout.flush()
        _write_all(out_fd, frame(_json_bytes(doc)))

    try:
        opts = build_parser().parse_args(argv)
        if opts.command is None:
            raise UsageFailure("a command is required: probe, check, run-one, eval or layers")
        if getattr(opts, "runs", 1) == 0 and getattr(opts, "min_time", 0.0) == 0:
            raise UsageFailure("--runs must be at least 1 (or give --min-time)")
    except UsageFailure as exc:
        emit({"runner_version": RUNNER_VERSION, "ok": False, "environment": None, "reports": [],
              "error": RunnerError("usage", str(exc), "python3 edgetk_runner.py {probe | check --bundle DIR "
                                   "[--artifact FILE]... [--runs N] [--warmup N] [--min-time S] [--threads N] "
                                   "[--runtime NAME]}").to_dict()})
        return 2
    if opts.command == "probe":
        emit(probe())
    elif opts.command == "memory":
        emit(memory_facts(opts.cgroup if opts.cgroup and os.path.isdir(opts.cgroup) else None))
    elif opts.command == "selected":
        try:
            emit({"runner_version": RUNNER_VERSION, "ok": True, "path": selected_model(opts.name, opts.root)})
        except RunnerError as exc:
            emit({"runner_version": RUNNER_VERSION, "ok": False, "path": None, "error": exc.to_dict()})
            return 1
    elif opts.command == "check":
        try:
            doc = check(opts)
        except MemoryError:
            doc = {"runner_version": RUNNER_VERSION, "ok": False, "environment": None, "reports": [],
                   "error": RunnerError("out_of_memory", "The runner itself ran out of memory on the device "
                                        "(MemoryError); the device has {} MB available.".format(
                                            memory_facts()["available_mb"]), OOM_HINT).to_dict()}
        emit(doc)
        if doc["error"] and doc["error"]["kind"] == "usage":
            return 2
    elif opts.command == "run-group":
        run_group(os.path.abspath(os.path.expanduser(opts.bundle)), opts.artifact, opts, emit)
    elif opts.command in ("eval", "layers"):
        emit(run_eval(opts) if opts.command == "eval" else run_layers(opts))
    else:
        bundle = os.path.abspath(os.path.expanduser(opts.bundle))
        emit(run_one(bundle, opts.artifact[0], opts, verify=not opts.skip_verify))
    return 0


if __name__ == "__main__":
    sys.exit(main())
