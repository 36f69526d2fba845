"""A .tflite file taken as it is (no conversion), so artifacts users already have can be bundled and checked.

Its inputs, outputs and quantization are read from the flatbuffer; ``predict`` runs it in ai-edge-litert and
returns float outputs (integer outputs dequantized with their own scale and zero point).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from toolkit.model.vocabulary import Framework
from toolkit.runtimes.inspection.tflite import inspect_tflite
from toolkit.sources.base import SourceModel


class TFLiteSource(SourceModel):
    """A ready .tflite model: the reference is the model itself, run in LiteRT."""

    framework = Framework.TFLITE

    def __init__(self, path: Path, *, threads: int | None = None) -> None:
        from toolkit.runtimes.execution.tflite import TFLiteSession

        self.path = Path(path)
        self._info = inspect_tflite(self.path)
        self._inputs, self._outputs = self._info.inputs, self._info.outputs
        self._session = TFLiteSession(self.path, threads=threads)

    @property
    def precision(self) -> str:
        return self._info.precision

    def predict(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self._session.run(feeds)

    def close(self) -> None:
        self._session.close()
