"""The ONNX backends, one per source framework (:data:`FROM_ONNX`, :data:`FROM_TF`, :data:`FROM_TORCH`,
:data:`FROM_TFLITE`): each exports the source once as float ONNX (its ``export``: ``prepare``, ``from_tf``,
``from_torch``, ``from_tflite``) and derives every precision from that export with onnxruntime's own tools
(``quant.derive``). What they share is the ``.onnx`` file (``artifact``) and onnxruntime: the recipes an old
onnxruntime cannot load (A16W8), reduce_range where the target's x86 kernels saturate (``saturation``), the
execution providers only the device has, the nodes an onnxruntime message names, the node locator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from toolkit.conversion.backend import Backend, Feeds, resolve
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.model.vocabulary import A16W8_MIN_ONNXRUNTIME, Format

if TYPE_CHECKING:
    from toolkit.conversion.graph_cuts import Cuts
    from toolkit.conversion.layers import LayerError, LayerTable
    from toolkit.conversion.node_ranking import NodeLocation
    from toolkit.conversion.policy import Policy
    from toolkit.model.recipe import Recipe
    from toolkit.runtimes.inspection.share import Layer

Export = Callable[[ConversionRequest, Path], BuiltArtifact]
FLOAT_EXPORT = "export.fp32.onnx"  # the run's one float export, in each request's workdir (one per opset)


class OnnxBackend(Backend):
    """An ONNX route from one source framework: ``export`` (``"module:function"``) writes its float ONNX."""

    format = Format.ONNX
    display = "ONNX"
    runtime = "onnxruntime"

    def __init__(self, export: str) -> None:
        self.export = export

    def float_export(self, request: ConversionRequest, output: Path) -> BuiltArtifact:
        return cast(Export, resolve(self.export))(request, output)

    def float_base(self, request: ConversionRequest) -> BuiltArtifact:
        """The float ONNX of the request's source, exported once per workdir (kept in ``request.exports``)."""
        path = request.workdir / FLOAT_EXPORT
        return request.exports.get(path, lambda: self.float_export(request, path))

    def build(self, request: ConversionRequest, output: Path) -> BuiltArtifact:
        from toolkit.conversion.onnx import quant

        return quant.derive(request, self.float_base(request), output)

    def layer_table(self, request: ConversionRequest, full: BuiltArtifact | None) -> LayerTable:
        """Of ``full`` when it is the full quantization, else (a mixed artifact) of the full quantization derived
        anew from the float export."""
        from toolkit.conversion.onnx.table import onnx_full_table

        return onnx_full_table(request, full, self.float_base(request))

    def planned(self, recipe: Recipe, arch: str | None) -> Recipe:
        from toolkit.conversion.onnx import saturation

        return saturation.resolved(recipe, arch)

    def profile_refusal(self, recipe: Recipe, policy: Policy) -> str | None:
        """int16 Q/DQ (A16W8) run in onnxruntime >= ``A16W8_MIN_ONNXRUNTIME`` only."""
        from toolkit.model.targets import parse_version

        if not (recipe.a16w8 and policy.onnxruntime_min):
            return None
        have, need = parse_version(policy.onnxruntime_min), parse_version(A16W8_MIN_ONNXRUNTIME)
        if have is None or need is None or have >= need:
            return None
        return (f"A16W8 ONNX needs onnxruntime >= {A16W8_MIN_ONNXRUNTIME} on the device (int16 Q/DQ); the "
                f"profile admits onnxruntime {policy.onnxruntime_min}")

    def device_only(self, recipe: Recipe, policy: Policy) -> tuple[str, ...]:
        """The recipe's accelerator providers this host's onnxruntime lacks (TensorRT/CUDA on a CPU-only host)."""
        wanted = [ep for ep in recipe.execution_providers if ep != "CPUExecutionProvider"]
        if not wanted:
            return ()
        import onnxruntime

        available = set(onnxruntime.get_available_providers())
        return tuple(ep for ep in wanted if ep not in available)

    def numerics(self, recipe: Recipe, arch: str | None) -> tuple[Mapping[str, str], str | None]:
        from toolkit.conversion.onnx import saturation

        options = saturation.target_numerics(recipe, arch)
        return options, (saturation.X64_QUANT_PRECISION_NOTE if options else None)

    def failing_ops(self, reason: str, request: ConversionRequest, artifact: Path) -> tuple[str, ...]:
        """The source nodes behind the nodes onnxruntime names (an artifact the build's own check refused is kept
        beside it for that: ``graph_io.refused_copy``)."""
        from toolkit.conversion.onnx.artifact import named_nodes, source_nodes
        from toolkit.conversion.onnx.graph_io import refused_copy

        built = next((p for p in (artifact, refused_copy(artifact)) if p.exists()), None)
        return tuple(source_nodes(built, named_nodes(reason)))

    def cuts(self, path: Path) -> Cuts:
        from toolkit.conversion.onnx import artifact

        return artifact.cuts(path)

    def weight_layers(self, path: Path) -> list[Layer]:
        from toolkit.runtimes.inspection.share import onnx_layers

        return onnx_layers(path)

    def nested_layers(self, path: Path) -> list[Layer]:
        from toolkit.conversion.onnx.fold import body_layers

        return body_layers(path)

    def locate(self, request: ConversionRequest, full: BuiltArtifact | None) -> NodeLocation:
        from toolkit.conversion.onnx.node_locator import locate_full

        return locate_full(request, full, self.float_base(request))

    def probe_order(self, path: Path, rows: Sequence[LayerError]) -> list[tuple[LayerError, str]]:
        from toolkit.conversion.onnx import artifact

        return artifact.graph_order(path, rows)

    def probe_tensors(self, path: Path, names: Sequence[str], feeds: Feeds,
                      input_names: Sequence[str]) -> dict[str, np.ndarray]:
        from toolkit.conversion.onnx import artifact

        return artifact.tensors(path, names, feeds, input_names)

    def probe_files(self, artifact: Path, tensors: Sequence[str], debug: Path) -> None:
        """onnxruntime reads only graph outputs: the device runs a copy with the probed tensors as outputs."""
        from toolkit.conversion.onnx.artifact import with_outputs

        with_outputs(artifact, tensors, debug)


FROM_ONNX = OnnxBackend("toolkit.conversion.onnx.prepare:prepare")
FROM_TF = OnnxBackend("toolkit.conversion.onnx.from_tf:export")
FROM_TORCH = OnnxBackend("toolkit.conversion.onnx.from_torch:export")
FROM_TFLITE = OnnxBackend("toolkit.conversion.onnx.from_tflite:export")  # tf2onnx's TFLite frontend (float only)
