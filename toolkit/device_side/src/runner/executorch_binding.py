"""ExecuTorch's Python binding (executorch.runtime, which imports torch): the fallback where no native
runner is installed.
"""
import os
from typing import Any, Dict  # noqa: F401
from .base import timed_calls
from .models import DEFAULT_PROFILE_RUNS, Tensor, import_numpy
from .pte import PTE_SCALAR_TYPES, PTE_TORCH_NOTE, PteBase

# --- shipped from here (the lines above are for the host's type checker) ---

class PteModel(PteBase):
    """An ExecuTorch program's ``forward`` through the Python bindings (``executorch.runtime``), which take and
    return torch tensors. Tensors are named ``input_<i>`` / ``output_<i>`` as the manifest records them (a .pte
    carries no names). ``etdump`` loads it with ExecuTorch's event tracer on (per-operator times)."""

    def __init__(self, version, path, threads, etdump=False):
        # type: (Any, str, int, bool) -> None
        import torch
        from executorch.runtime import Runtime

        numpy = import_numpy()
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

    def set_inputs(self, pairs):
        # type: (list) -> None
        numpy = import_numpy()
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

    def bundled_check(self, bundle, record, name, atol):
        # type: (str, Dict[str, Any], str, float) -> Dict[str, Any]
        """ExecuTorch's own verifier in the Python binding."""
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

    def etdump_profile(self, path, threads, first, top):
        # type: (str, int, list, int) -> Dict[str, Any]
        """The ETDump read by ``executorch.devtools.Inspector`` (delegate calls and portable operators by name).
        The Python wheel's runtime may be built without the tracer: then it says so."""
        import tempfile

        traced = PteModel(self.version, path, threads, etdump=True)
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
