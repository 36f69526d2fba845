"""ExecuTorch's loader: the native runner where setup installed it (executorch_native), else the Python binding
(executorch_binding, which imports torch); what both share is the pte block.
"""
from typing import Any, Dict, List, Tuple  # noqa: F401
from .environment import dist_version
from .executorch_binding import PteModel
from .executorch_native import NativePteModel
from .models import Loader, Model
from .pte import native_pte_runner, pte_bundled_check, pte_placement, pte_version_lock

# --- shipped from here (the lines above are for the host's type checker) ---

class ExecuTorchLoader(Loader):
    """ExecuTorch: the native runner where setup installed it, else the Python binding (which imports torch)."""

    shares_import = True  # the binding's import of torch dominates a worker's life: run-group pays it once

    def prepare(self, record):
        # type: (Dict[str, Any]) -> Any
        native = native_pte_runner()
        pte_version_lock(record, dist_version("executorch"))
        if native is None:
            import executorch.runtime  # noqa: F401 (imports torch too: part of import_ms)
        return native

    def open(self, prepared, version, path, record, threads, options):
        # type: (Any, Any, str, Dict[str, Any], int, Dict[str, Any]) -> Model
        if prepared is not None:
            return NativePteModel(version, path, threads, prepared)
        return PteModel(version, path, threads)

    def placement(self, model, path, record, threads, opts, intended, first, times, top):
        # type: (Any, str, Dict[str, Any], int, Any, str, list, List[float], int) -> Tuple[dict, Any]
        profile = model.etdump_profile(path, threads, first, top) if getattr(opts, "profile", False) else None
        return pte_placement(record), profile

    def own_checks(self, bundle, record, model, report):
        # type: (str, Dict[str, Any], Any, Dict[str, Any]) -> None
        """Its bundled program's numbers: a failure fails the outputs check too."""
        report["bundled_check"] = pte_bundled_check(bundle, record, model)
        if report["bundled_check"] and not report["bundled_check"]["ok"] and report.get("outputs_match"):
            report["outputs_match"]["ok"] = False

    def import_once(self):
        # type: () -> None
        if native_pte_runner() is None:
            import executorch.runtime  # noqa: F401 (imports torch)
