"""ExecuTorch's Python binding (executorch.runtime, which imports torch): the fallback where no native
runner is installed.
"""
from typing import Any  # noqa: F401
from .base import timed_calls
from .executorch import PTE_SCALAR_TYPES, PTE_TORCH_NOTE
from .models import Tensor, import_numpy

# --- shipped from here (the lines above are for the host's type checker) ---

class PteModel(object):
    """An ExecuTorch program's ``forward`` through the Python bindings (``executorch.runtime``), which take and
    return torch tensors. Tensors are named ``input_<i>`` / ``output_<i>`` as the manifest records them (a .pte
    carries no names). ``etdump`` loads it with ExecuTorch's event tracer on (per-operator times)."""

    format = "pte"

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

    def dynamic_batch(self):
        # type: () -> bool
        return False

    def resize_batch(self, batch):
        # type: (int) -> None
        """A .pte runs the batch it was exported with."""

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
