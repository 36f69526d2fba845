"""Run an artifact on this host in its real runtime (ai-edge-litert for .tflite, onnxruntime for .onnx,
ExecuTorch for .pte).

Used by verification and host timing. (The device side has its own single-file runner, which imports
nothing from here.)
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Mapping

import numpy as np

from toolkit.errors import UsageError
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import Runtime
from toolkit.runtimes.tensor_io import TensorIO


class HostSession(TensorIO, abc.ABC):
    """A loaded artifact. ``run`` takes and returns float32 arrays; integer I/O is (de)quantized here with
    the tensor's own scale and zero point, so callers compare every artifact with the float model alike."""

    runtime: Runtime

    @abc.abstractmethod
    def run_raw(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Feeds already in the artifact's own dtypes; outputs as the runtime returns them."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        raw = {spec.name: quantize_input(spec, np.asarray(feeds[spec.name])) for spec in self.inputs}
        return [dequantize_output(spec, out) for spec, out in zip(self.outputs, self.run_raw(raw))]

    def close(self) -> None:
        """Release the runtime's resources."""


def quantize_input(spec: TensorSpec, value: np.ndarray) -> np.ndarray:
    """Float data -> the input's dtype; integer inputs use the tensor's scale/zero point."""
    dtype = np.dtype(spec.dtype)
    if spec.quantization is not None and np.issubdtype(dtype, np.integer) and not np.issubdtype(
        value.dtype, np.integer
    ):
        scale = spec.quantization.scale[0]
        zero = spec.quantization.zero_point[0]
        info = np.iinfo(dtype)
        return np.clip(np.round(value / scale + zero), info.min, info.max).astype(dtype)
    return value.astype(dtype, copy=False)


def dequantize_output(spec: TensorSpec, value: np.ndarray) -> np.ndarray:
    """An integer output with quantization parameters -> float32; float outputs as float32."""
    if spec.quantization is not None and np.issubdtype(value.dtype, np.integer):
        scale = spec.quantization.scale[0]
        zero = spec.quantization.zero_point[0]
        return ((value.astype(np.float32) - zero) * scale).astype(np.float32)
    return np.asarray(value, dtype=np.float32)


def open_session(path: Path, *, threads: int | None = None, config: Mapping[str, str] | None = None) -> HostSession:
    """Load ``path`` in the runtime its format needs; ``config``: onnxruntime session config entries (an .onnx
    only)."""
    suffix = path.suffix.lower()
    if suffix == ".tflite":
        from toolkit.runtimes.execution.tflite import TFLiteSession

        return TFLiteSession(path, threads=threads)
    if suffix == ".onnx":
        from toolkit.runtimes.execution.onnx import OnnxSession

        return OnnxSession(path, threads=threads, config=config)
    if suffix == ".pte":
        from toolkit.runtimes.execution.pte import PteSession

        return PteSession(path, threads=threads)
    raise UsageError(f"{path} is not a .tflite, .onnx or .pte file.", hint="Pass a converted artifact.")
