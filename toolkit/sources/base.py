"""The interface every source framework implements."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Mapping

import numpy as np

from toolkit.model.vocabulary import Framework
from toolkit.runtimes.tensor_io import TensorIO


class SourceModel(TensorIO, abc.ABC):
    """A loaded float model: its I/O as recorded in the model (set by each loader), and reference predictions.

    ``inputs`` keep ``None`` where a dimension is dynamic; the convert stage resolves them (calibration data,
    ``--input-shape``) and passes concrete shapes to the routes.
    """

    framework: Framework
    path: Path

    @abc.abstractmethod
    def predict(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Float reference outputs for one batch of inputs (keyed by input name), in ``outputs`` order."""

    def adopt_input_dtypes(self, dtypes: Mapping[str, str]) -> None:
        """Take the data's dtype for inputs whose dtype the model does not record (an eager PyTorch module
        fed token ids). Models that record their dtypes ignore this."""

    def close(self) -> None:
        """Release what the framework holds (sessions, graphs). Optional."""
