"""A .pte artifact in ExecuTorch's Python runtime on this host (XNNPACK and portable kernels), for verification
and host timing. ExecuTorch takes torch tensors, so this imports torch (as the runtime itself does)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.model.vocabulary import Runtime
from toolkit.runtimes.execution import HostSession
from toolkit.runtimes.inspection.pte import load_program, tensor_specs


class PteSession(HostSession):
    """The program's ``forward`` loaded once; ``threads`` sizes ExecuTorch's (process-wide) thread pool."""

    runtime = Runtime.EXECUTORCH

    def __init__(self, path: Path, *, threads: int | None = None) -> None:
        import torch

        self.path = Path(path)
        self._torch = torch
        program = load_program(self.path)
        if threads is not None:
            from toolkit.compat import executorch as executorch_compat

            executorch_compat.set_threads(int(threads))
        self._program = program
        self._method: Any = program.load_method("forward")  # Any: ExecuTorch's Method (untyped)
        meta = program.metadata("forward")
        self._inputs = tensor_specs(meta, "input")
        self._outputs = tensor_specs(meta, "output")

    def run_raw(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        args = [self._torch.from_numpy(np.ascontiguousarray(feeds[spec.name])) for spec in self._inputs]
        return [out.detach().numpy().copy() for out in self._method.execute(args)]

    def close(self) -> None:
        self._method = None
        self._program = None
