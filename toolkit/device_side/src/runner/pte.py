"""What both ExecuTorch paths share (the native runner, the Python binding): the model they offer (PteBase),
the version lock, where its libraries and the native runner are, the bundled program check and placement. The
loader that picks a path is the executorch block, after both.
"""
import os
from typing import Any, Dict  # noqa: F401
from .base import RunnerError
from .environment import safe_name
from .models import Model, XNNPACK, placement_record

# --- shipped from here (the lines above are for the host's type checker) ---

# ExecuTorch ScalarType codes -> numpy dtype names
PTE_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                    7: "float64", 11: "bool"}  # type: Dict[Any, str]  # looked up with what JSON and flatbuffers give


PTE_TORCH_NOTE = ("ran through ExecuTorch's Python binding, which imports torch (its load time and peak memory "
                  "include torch's): the native runner is not installed here; `edgetk devices setup --runtime "
                  "executorch` installs it")


PTE_RUNNER_BINARY = "edgetk-pte-runner"  # installed by setup into executorch's lib/ folder, beside its libraries


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
    given = record.get("pte")
    info = given if isinstance(given, dict) else {}
    wanted = info.get("executorch_version")
    if wanted and installed and installed != wanted:
        raise RunnerError(
            "missing_runtime",
            "{} was exported by executorch {}; this device has executorch {}, which is not guaranteed to load "
            "it.".format(record.get("file"), wanted, installed),
            "Install executorch=={} on the device: `edgetk devices setup --device DEVICE --runtime executorch` "
            "(or pip install --no-deps executorch=={}), or convert with executorch {} on the host.".format(
                wanted, wanted, installed))


def pte_bundled_check(bundle, record, model):
    # type: (str, Dict[str, Any], PteBase) -> Any
    """The artifact's ExecuTorch bundled program (``model.<p>.bpte``): every bundled input against the float
    model's outputs at the manifest's ``bundled_atol``, through the native runner when ``model`` is one, else by
    ExecuTorch's own verifier in the Python binding. None when the bundle has none; ``{"ok", "cases", "failed",
    "atol"}`` otherwise (this device checked its own numbers)."""
    given = record.get("pte")
    info = given if isinstance(given, dict) else {}
    name = info.get("bundled")
    if not isinstance(name, str) or not safe_name(name) or not os.path.isfile(os.path.join(bundle, name)):
        return None
    atol = float(info.get("bundled_atol") or 0.0)
    return model.bundled_check(bundle, record, name, atol)


def pte_placement(record):
    # type: (dict) -> dict
    """What the convert stage counted: the XNNPACK delegate's share of the program's operator nodes."""
    given = record.get("pte")
    info = given if isinstance(given, dict) else {}
    total, on = info.get("total_nodes"), info.get("delegated_nodes")
    share = float(on) / total if isinstance(total, int) and isinstance(on, int) and total else None
    return placement_record(XNNPACK, total, on, None, [], "graph" if total else "none",
                            "XNNPACK delegated {} of {} operator nodes at convert time ({:.0%}); the rest runs on "
                            "ExecuTorch's portable kernels.".format(on, total, share or 0.0) if total else
                            "the manifest records no delegation count")


class PteBase(Model):
    """What both ExecuTorch paths (the native runner, the Python binding) offer beyond every model. A .pte runs the
    batch it was exported with: the model's fixed batch (``Model.dynamic_batch``) holds."""

    format = "pte"

    def bundled_check(self, bundle, record, name, atol):
        # type: (str, Dict[str, Any], str, float) -> Dict[str, Any]
        """The bundled program ``name``'s cases, each output within ``atol`` (pte_bundled_check)."""
        raise NotImplementedError

    def etdump_profile(self, path, threads, first, top):
        # type: (str, int, list, int) -> Dict[str, Any]
        """Per-operator times from ExecuTorch's ETDump over DEFAULT_PROFILE_RUNS runs of a second program
        loaded with the event tracer: ``{"available", "source", "runs", "top": [{"name", "calls", "total_ms",
        "mean_ms"}]}``."""
        raise NotImplementedError
