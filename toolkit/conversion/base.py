"""What a conversion route receives (:class:`ConversionRequest`) and returns (:class:`BuiltArtifact`); the route's
backend (``backend``) builds it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from toolkit.sources.base import SourceModel
from toolkit.model.artifact import FloatIO, PteRecord
from toolkit.model.recipe import Recipe


# Weighted compute ops (ONNX and TFLite names): which kind a model is, what a quantizer would quantize
MATMUL_OPS = frozenset({
    "MatMul", "Gemm", "LSTM", "GRU", "RNN", "Attention", "MultiHeadAttention", "Einsum", "MatMulInteger",
    "FULLY_CONNECTED", "BATCH_MATMUL", "UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM",
    "UNIDIRECTIONAL_SEQUENCE_RNN", "EMBEDDING_LOOKUP",
})
CONV_OPS = frozenset({"Conv", "ConvTranspose", "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "CONV_3D"})


class FloatExports:
    """The float exports of one run, by path: each exported once and shared by every recipe derived from it (the
    run owns it: ``ConvertRun.caches``; a request made alone gets its own)."""

    def __init__(self) -> None:
        self._built: dict[Path, BuiltArtifact] = {}

    def get(self, path: Path, export: Callable[[], BuiltArtifact]) -> BuiltArtifact:
        """The export at ``path``, made by ``export`` the first time (or when its file is gone)."""
        built = self._built.get(path)
        if built is None or not built.path.is_file():
            built = self._built[path] = export()
        return built


@dataclass(frozen=True)
class ConversionRequest:
    """One artifact to build. ``calibration``: one validated feed per sample, shaped like ``input_shapes``, each input
    in the model's own dtype (:func:`as_input_dtype`), never the held-out samples used for verification."""

    source: SourceModel
    recipe: Recipe
    input_shapes: Mapping[str, tuple[int, ...]]
    calibration: tuple[Mapping[str, np.ndarray], ...]
    workdir: Path  # scratch space owned by this request; the route writes its artifact here
    max_opset: int | None = None  # the target runtime's highest loadable ONNX opset
    dynamic_batch: bool = False
    exports: FloatExports = field(default_factory=FloatExports, compare=False, repr=False)


@dataclass(frozen=True)
class BuiltArtifact:
    """A model file a route wrote, and what the route wants the report to say about it."""

    path: Path
    float_nodes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    exporter: str | None = None  # e.g. "tf2onnx 1.17 (from_function)", "torch.onnx (legacy TorchScript)"
    layout: str | None = None  # the artifact's image layout when it differs from the source's
    float_io: tuple[FloatIO, ...] = ()  # integer I/O asked for that stayed float, and why
    pte: PteRecord | None = None  # ExecuTorch: the share of the graph the XNNPACK delegate took


def as_input_dtype(value: np.ndarray, dtype: str | np.dtype) -> np.ndarray:
    """``value`` as the model input of ``dtype`` takes it: integer inputs (token ids, byte features) stay
    integers, float inputs are fed as float32 (float16/float64 inputs included: converters calibrate in
    float32). Casting every input to float32 is what broke static INT8 on models with embeddings."""
    want = np.dtype(dtype)
    if np.issubdtype(want, np.floating):
        want = np.dtype(np.float32) if want != np.float64 else want
    return np.asarray(value).astype(want, copy=False)
