"""ExecuTorch, whichever path runs the .pte: the version lock, where its libraries are, the bundled program
check, placement and the ETDump profile.
"""
import os
from typing import Any  # noqa: F401
from .base import RunnerError
from .environment import safe_name
from .executorch_binding import PteModel
from .executorch_native import NativePteModel, PTE_RUNNER_BINARY, native_bundled_check
from .models import DEFAULT_PROFILE_RUNS, XNNPACK, placement_record

# --- shipped from here (the lines above are for the host's type checker) ---

# ExecuTorch ScalarType codes -> numpy dtype names
PTE_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                    7: "float64", 11: "bool"}


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


def pte_bundled_check(bundle, record, model=None):
    # type: (str, dict, Any) -> Any
    """The artifact's ExecuTorch bundled program (``model.<p>.bpte``): every bundled input against the float
    model's outputs at the manifest's ``bundled_atol``, through the native runner when ``model`` is one, else by
    ExecuTorch's own verifier in the Python binding. None when the bundle has none; ``{"ok", "cases", "failed",
    "atol"}`` otherwise (this device checked its own numbers)."""
    info = record.get("pte")
    name = info.get("bundled") if isinstance(info, dict) else None
    if not safe_name(name) or not os.path.isfile(os.path.join(bundle, name)):
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
