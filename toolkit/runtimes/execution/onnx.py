"""An .onnx artifact in onnxruntime on this host (CPU provider), for verification and host timing."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import MissingDependency, UsageError, key_line
from toolkit.runtimes.execution import HostSession
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import Runtime

ORT_TYPES = {  # ONNX Runtime's type names -> numpy dtype names (host sessions and onnx_checks read them)
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int16)": "int16",
    "tensor(uint16)": "uint16",
    "tensor(int32)": "int32",
    "tensor(uint32)": "uint32",
    "tensor(int64)": "int64",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "object",
}


def _spec(arg: Any) -> TensorSpec:  # Any: an onnxruntime NodeArg (untyped)
    shape = tuple(d if isinstance(d, int) and d > 0 else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, shape, ORT_TYPES.get(arg.type, "float32"))


class OnnxSession(HostSession):
    """``onnxruntime.InferenceSession`` on the CPU provider; ``threads`` sets ``intra_op_num_threads``.

    Our ONNX artifacts keep float32 I/O (QDQ and fp16 with io kept float), so ``run`` only casts.
    """

    runtime = Runtime.ONNXRUNTIME

    def __init__(self, path: Path, *, threads: int | None = None, config: Mapping[str, str] | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover
            raise MissingDependency("onnxruntime", extra="onnx", purpose="Running an ONNX artifact") from exc
        self.path = Path(path)
        if not self.path.is_file():
            raise UsageError(f"{self.path} does not exist.", hint="Pass the path of an .onnx artifact.")
        self.threads = threads
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # The convert stage times several sessions (ORT and LiteRT) in one process: idle intra-op pools that
        # spin steal the cores from the next one timed (LiteRT fp32 MobileNetV2 3.4 ms alone, 7.3 ms after).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.config = dict(config or {})  # session config entries beyond the defaults (target numerics)
        for key, value in self.config.items():
            options.add_session_config_entry(key, value)
        if threads is not None:
            options.intra_op_num_threads = int(threads)
            options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise UsageError(
                f"onnxruntime {ort.__version__} cannot load {self.path.name}: {key_line(exc)}",
                hint="Rebuild the artifact with `edgetk convert`, or check the file is a complete ONNX model.",
            ) from exc
        self._inputs = tuple(_spec(a) for a in self._session.get_inputs())
        self._outputs = tuple(_spec(a) for a in self._session.get_outputs())

    def run_raw(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(out) for out in self._session.run(None, dict(feeds))]

    def close(self) -> None:
        self._session = None
