"""An ONNX file as a conversion source: I/O read from the graph, reference outputs from onnxruntime (CPU).

The original model is what every artifact is compared against, so ``predict`` runs it exactly as given (no
shape pinning, no opset upgrade): the convert stage's own changes must be measured, not assumed harmless.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import MissingDependency, UsageError, key_line
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import Framework
from toolkit.runtimes.inspection.onnx import load_onnx, tensor_specs
from toolkit.sources.base import SourceModel


class OnnxSource(SourceModel):
    """An ONNX model file. I/O come from the graph; ``predict`` runs the original file in onnxruntime."""

    framework = Framework.ONNX

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        model = load_onnx(self.path)
        self._inputs, self._outputs = tensor_specs(model)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        self._session: Any = None  # Any: an onnxruntime InferenceSession


    def _open(self) -> Any:  # Any: the InferenceSession, as above
        if self._session is None:
            try:
                import onnxruntime as ort
            except ImportError as exc:  # pragma: no cover
                raise MissingDependency("onnxruntime", extra="onnx", purpose="Running an ONNX model") from exc
            options = ort.SessionOptions()
            options.log_severity_level = 3
            try:
                self._session = ort.InferenceSession(
                    str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:
                raise UsageError(
                    f"onnxruntime cannot load {self.path}: {key_line(exc)}",
                    hint="Check that the model is valid (onnx.checker) and uses operators onnxruntime supports.",
                ) from exc
        return self._session

    def predict(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        session = self._open()
        missing = [spec.name for spec in self._inputs if spec.name not in feeds]
        if missing:
            raise UsageError(f"No data for the model input(s) {', '.join(missing)}.")
        prepared = {
            spec.name: np.asarray(feeds[spec.name]).astype(spec.dtype, copy=False) for spec in self._inputs
        }
        try:
            return [np.asarray(out) for out in session.run(None, prepared)]
        except Exception as exc:
            shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in prepared.items())
            raise UsageError(
                f"The ONNX model {self.path.name} rejected inputs {shapes}: {key_line(exc)}",
                hint="Check the input shapes (--input-shape NAME=D0,D1,...) and the calibration data layout.",
            ) from exc

    def close(self) -> None:
        self._session = None
