"""The PyTorch -> TFLite backend through litert-torch (PT2E static INT8, fp32): a ``.tflite`` file like the
TensorFlow route's (its cuts, probe and runtimes: ``tflite.backend``), built and measured the PT2E way: its layer
table is PT2E's own (``table``), and an op a runtime names is kept float through the FX nodes it came from
(``pt2e.tflite_fx``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.tflite.backend import TfliteBackend

if TYPE_CHECKING:
    from toolkit.conversion.layers import LayerTable


class LitertBackend(TfliteBackend):
    """PyTorch (a factory or an ExportedProgram) -> TFLite with litert-torch."""

    def build(self, request: ConversionRequest, output: Path) -> BuiltArtifact:
        from toolkit.conversion.pt2e.litert import convert

        return convert(request, output)

    def layer_table(self, request: ConversionRequest, full: BuiltArtifact | None) -> LayerTable:
        from toolkit.conversion.pt2e.table import pt2e_table

        return pt2e_table(request, full)

    def failing_ops(self, reason: str, request: ConversionRequest, artifact: Path) -> tuple[str, ...]:
        """The FX nodes behind the TFLite ops the message names (PT2E's exclusions take FX node names)."""
        from toolkit.conversion.pt2e import quantize, tflite_fx
        from toolkit.conversion.tflite.artifact import named_ops
        from toolkit.runtimes.inspection.tflite import main_graph_ops

        named = named_ops(reason)
        if not named:
            return ()
        ops = main_graph_ops(artifact) if artifact.exists() else []
        return tflite_fx.fx_nodes(ops, quantize.graph_ops(request), named)


LITERT = LitertBackend()
