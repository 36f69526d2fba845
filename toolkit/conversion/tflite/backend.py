"""The TFLite backends: Keras/SavedModel -> TFLite through TensorFlow's converter (:data:`KERAS`), and a ``.tflite``
source shipped as it is (:data:`AS_IS`). What they share (:class:`TfliteBackend`) is the ``.tflite`` file
(``artifact``): its cuts, its layer tensors and weights, the bounded TFLite runtimes (tflite-runtime 2.14) that
must load it, the Edge TPU only the device has. ``pt2e.backend`` builds TFLite files too, from PyTorch, on it.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.conversion.backend import Backend, Feeds
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.model.vocabulary import Format, IoDtype, Precision

if TYPE_CHECKING:
    from toolkit.conversion.graph_cuts import Cuts
    from toolkit.conversion.layers import LayerError, LayerTable
    from toolkit.conversion.policy import Policy
    from toolkit.model.recipe import Recipe
    from toolkit.runtimes.inspection import ModelInfo
    from toolkit.runtimes.inspection.share import Layer


class TfliteBackend(Backend):
    """What every route that writes a ``.tflite`` shares: the file (its cuts, layer tensors and layers) and the
    runtimes that load it. A route adds how it builds and measures (``build``, ``layer_table``, ``failing_ops``)."""

    format = Format.TFLITE
    display = "TFLite"
    runtime = "the interpreter"

    def default_io(self, precision: Precision) -> IoDtype:
        """Full INT8 TFLite takes and gives int8 (what microcontroller-class runtimes and the Edge TPU want)."""
        return IoDtype.INT8 if precision == Precision.INT8 else IoDtype.FLOAT32

    def load_problems(self, path: Path, policy: Policy) -> str:
        from toolkit.runtimes.compat import tflite_incompatibilities

        reasons = []
        for runtime, max_version in policy.tflite_bounds:
            problems = tflite_incompatibilities(path, runtime, max_version)
            if problems:
                reasons.append(f"{runtime} <= {max_version} does not know {', '.join(problems)}")
        return "; ".join(reasons)

    def device_only(self, recipe: Recipe, policy: Policy) -> tuple[str, ...]:
        if policy.edgetpu and recipe.precision == Precision.INT8:
            return ("the Edge TPU (once compiled by edgetpu_compiler)",)
        return ()

    def weight_layers(self, path: Path) -> list[Layer]:
        from toolkit.runtimes.inspection.share import tflite_layers

        return tflite_layers(path)

    def cuts(self, path: Path) -> Cuts:
        from toolkit.conversion.tflite import artifact

        return artifact.cuts(path)

    def probe_order(self, path: Path, rows: Sequence[LayerError]) -> list[tuple[LayerError, str]]:
        from toolkit.conversion.tflite import artifact

        return artifact.graph_order(path, rows)

    def probe_tensors(self, path: Path, names: Sequence[str], feeds: Feeds,
                      input_names: Sequence[str]) -> dict[str, np.ndarray]:
        from toolkit.conversion.tflite import artifact

        return artifact.tensors(path, names, feeds, input_names)


class KerasBackend(TfliteBackend):
    """Keras/SavedModel -> TFLite: fp32, fp16, dynamic range, full int8 and A16W8 (``convert``)."""

    def build(self, request: ConversionRequest, output: Path) -> BuiltArtifact:
        from toolkit.conversion.tflite.convert import convert

        return convert(request, output)

    def layer_table(self, request: ConversionRequest, full: BuiltArtifact | None) -> LayerTable:
        from toolkit.conversion.tflite.table import tflite_table

        return tflite_table(request, full)

    def failing_ops(self, reason: str, request: ConversionRequest, artifact: Path) -> tuple[str, ...]:
        """The op types the message names (the TF converter's ``nodes_to_exclude`` takes op types)."""
        from toolkit.conversion.tflite.artifact import named_ops

        return tuple(op for op, _ in named_ops(reason))


class AsIsBackend(TfliteBackend):
    """A ``.tflite`` source ships as it is: its precision is what the file holds, no op of it can be kept float."""

    def build(self, request: ConversionRequest, output: Path) -> BuiltArtifact:
        shutil.copyfile(request.source.path, output)
        return BuiltArtifact(path=output, notes=("taken as it is (no conversion)",))

    def as_built(self, recipe: Recipe, info: ModelInfo) -> Recipe:
        import dataclasses

        return dataclasses.replace(recipe, precision=info.precision)


KERAS = KerasBackend()
AS_IS = AsIsBackend()
