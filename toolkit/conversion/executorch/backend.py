"""The PyTorch -> ExecuTorch backend (``.pte``, XNNPACK-delegated; PT2E static INT8 with XNNPACK's quantizer).
Its layer table is PT2E's (``pt2e.table``); the delegate runs the graph as one call, so no op a runtime names can
be kept float, no graph is cut and no layer tensor is probed; each ``.pte`` ships with its bundled program
(``bundled``), which the device checks itself against."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.conversion.backend import Backend, Feeds
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.model.vocabulary import Format

if TYPE_CHECKING:
    from toolkit.conversion.layers import LayerTable
    from toolkit.model.artifact import ArtifactRecord
    from toolkit.model.tensors import TensorSpec


class ExecutorchBackend(Backend):
    format = Format.PTE
    display = ".pte"
    runtime = "ExecuTorch"
    probe_refusal = "no layer probe: an ExecuTorch program shows the runner no intermediate tensors"

    def build(self, request: ConversionRequest, output: Path) -> BuiltArtifact:
        from toolkit.conversion.executorch.convert import convert

        return convert(request, output)

    def layer_table(self, request: ConversionRequest, full: BuiltArtifact | None) -> LayerTable:
        from toolkit.conversion.pt2e.table import pt2e_table

        return pt2e_table(request, full)

    def bundled(self, record: ArtifactRecord, staging: Path, inputs: Sequence[TensorSpec], feeds: Feeds,
                reference: Sequence[Sequence[np.ndarray]], outputs: Sequence[Sequence[np.ndarray]]) -> ArtifactRecord:
        """The device checks itself: ``model.<precision>.bpte`` beside the ``.pte``, float outputs at a limit."""
        from toolkit.conversion.executorch.bundled import attach

        return attach(record, staging, inputs, feeds, reference, outputs)


EXECUTORCH = ExecutorchBackend()
