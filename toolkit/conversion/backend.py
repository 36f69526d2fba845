"""A format backend: everything the shared convert walk asks of the route that builds an artifact, in one interface.

The walk (``plan``, ``candidate``, ``crash_guard``, ``runtime_retry``, ``selective``, ``layer_probe``, ``write``)
knows no format: it asks the run's backend (``ConvertRun.backend``), which the route row names
(``routes.Route.backend``) and :func:`backend_for` imports once per process. A backend builds the artifact (and
the float ONNX export every ONNX precision derives from), measures its layer table, names the ops a runtime's
message blames, cuts its graph for the crash guard, reads its layer tensors for the device's layer probe, and says
what the plan and the verification must know of its format (its default I/O type, the recipes a profile's runtimes
cannot load, the accelerators only the device has).

The packages: ``tflite`` (Keras/SavedModel -> TFLite; a ``.tflite`` source taken as it is), ``pt2e`` (PyTorch ->
TFLite through litert-torch), ``onnx`` (every source -> ONNX), ``executorch`` (PyTorch -> ``.pte``). Each one's
``backend.py`` subclasses :class:`Backend` and imports its framework only inside its methods, so reading the route
table stays light (``edgetk --help``). A new format is one package, its ``backend.py`` and route rows naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from toolkit.errors import ConversionError, UsageError
from toolkit.model.vocabulary import Format, IoDtype, Precision

if TYPE_CHECKING:
    import numpy as np

    from toolkit.conversion.base import BuiltArtifact, ConversionRequest
    from toolkit.conversion.graph_cuts import Cuts
    from toolkit.conversion.layers import LayerError, LayerTable
    from toolkit.conversion.node_ranking import NodeLocation
    from toolkit.conversion.policy import Policy
    from toolkit.model.artifact import ArtifactRecord
    from toolkit.model.recipe import Recipe
    from toolkit.model.tensors import TensorSpec
    from toolkit.runtimes.inspection import ModelInfo
    from toolkit.runtimes.inspection.share import Layer

Feeds = Sequence[Mapping[str, "np.ndarray"]]  # held-out feeds, by input name (numpy: only where used)


class Backend:
    """One route's backend. The defaults are what a format without the feature does: no layer table, no op named
    in a runtime's message, no graph cuts, no layer probe, float I/O, loadable wherever its runtime is."""

    format: ClassVar[Format]
    display: ClassVar[str]  # "TFLite": the artifact's kind in messages ("the int8 TFLite crashed ...")
    runtime: ClassVar[str]  # "the interpreter": the runtime a crash message names
    probe_refusal: ClassVar[str | None] = None  # why an INT8 artifact of the format gets no layer probe

    # ----------------------------------------------------------------------------------------- building

    def build(self, request: ConversionRequest, output: Path) -> BuiltArtifact:
        """Write ``request``'s artifact to ``output``; a recipe the route does not build raises ``UsageError``."""
        raise NotImplementedError

    def float_export(self, request: ConversionRequest, output: Path) -> BuiltArtifact:
        """The source as a float ONNX model (the base every ONNX precision derives from)."""
        raise UsageError(f"No ONNX route from {request.source.framework}.")

    def layer_table(self, request: ConversionRequest, full: BuiltArtifact | None) -> LayerTable:
        """The layer-wise error table of ``request``'s full INT8 recipe (``full``: its artifact when built in full)."""
        raise ConversionError(f"not available for {request.source.framework} sources (Keras/SavedModel/PyTorch only)")

    # ----------------------------------------------------------------------------------------- planning

    def default_io(self, precision: Precision) -> IoDtype:
        """The I/O type of a recipe of ``precision`` that names none."""
        return IoDtype.FLOAT32

    def planned(self, recipe: Recipe, arch: str | None) -> Recipe:
        """``recipe`` with what the target's CPU decides (``arch``) settled, where the profile left it unset."""
        return recipe

    def profile_refusal(self, recipe: Recipe, policy: Policy) -> str | None:
        """Why the profile's devices cannot load ``recipe``'s artifact, known before building it (None: they can)."""
        return None

    # ----------------------------------------------------------------------------------------- verifying

    def load_problems(self, path: Path, policy: Policy) -> str:
        """Why a runtime of the profile (bounded by version) cannot load the built ``path``; "" when all can."""
        return ""

    def device_only(self, recipe: Recipe, policy: Policy) -> tuple[str, ...]:
        """The accelerators the device runs ``recipe`` on that this host lacks (its CPU timings say nothing)."""
        return ()

    def as_built(self, recipe: Recipe, info: ModelInfo) -> Recipe:
        """The recipe the built artifact is (a file taken as it is has its own precision)."""
        return recipe

    def numerics(self, recipe: Recipe, arch: str | None) -> tuple[Mapping[str, str], str | None]:
        """The runtime's session options that verify ``recipe`` with the target's arithmetic on this host, and the
        note that says so (none: this host computes as the target)."""
        return {}, None

    # ----------------------------------------------------------------------------------------- after a failure

    def failing_ops(self, reason: str, request: ConversionRequest, artifact: Path) -> tuple[str, ...]:
        """The ops a runtime's failure message ``reason`` names, as ``nodes_to_exclude`` entries of the route
        (``artifact``: where the failing artifact was built, when it still exists); () when none."""
        return ()

    def cuts(self, path: Path) -> Cuts | None:
        """The artifact's main graph cut after each op (``graph_cuts``); None: the format is not cut."""
        return None

    def weight_layers(self, path: Path) -> list[Layer]:
        """The weighted layers of the artifact at ``path`` with their weights (what ``selective`` weighs a float
        set by); none where the format's weights are not read here (a ``.pte``)."""
        return []

    def nested_layers(self, path: Path) -> list[Layer]:
        """The weighted layers of the artifact at ``path`` when every one sits inside a control-flow body (If, Loop,
        Scan), else none: there the layer table has no row for them and static quantization never reaches them."""
        return []

    def locate(self, request: ConversionRequest, full: BuiltArtifact | None) -> NodeLocation | None:
        """Every node of the full INT8 quantization ranked by the error it adds, activation-only nodes included
        (``selective``'s front ends); None where the backend has no such ranking (the layer table decides)."""
        return None

    # ----------------------------------------------------------------------------------------- the layer probe

    def probe_order(self, path: Path, rows: Sequence[LayerError]) -> list[tuple[LayerError, str]]:
        """(table row, tensor name) for the rows whose tensor the artifact has, in the order its graph runs them."""
        return []

    def probe_tensors(self, path: Path, names: Sequence[str], feeds: Feeds,
                      input_names: Sequence[str]) -> dict[str, np.ndarray]:
        """``names`` of the artifact at ``path`` over ``feeds`` (float, stacked per sample); absent names left out."""
        return {}

    def probe_files(self, artifact: Path, tensors: Sequence[str], debug: Path) -> None:
        """Write what the device needs to read ``tensors`` of ``artifact`` besides the artifact (ONNX: a copy with
        them as graph outputs, at ``debug``)."""

    # ----------------------------------------------------------------------------------------- the bundle

    def bundled(self, record: ArtifactRecord, staging: Path, inputs: Sequence[TensorSpec], feeds: Feeds,
                reference: Sequence[Sequence[np.ndarray]], outputs: Sequence[Sequence[np.ndarray]]) -> ArtifactRecord:
        """``record`` with the files its format adds beside the artifact in the bundle (ExecuTorch: its bundled
        program)."""
        return record


def resolve(spec: str) -> object:
    """``"package.module:NAME"`` -> that object (imports the module: route rows and exports name theirs so)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@cache
def backend_for(framework: str, fmt: str) -> Backend:
    """The backend of the route (framework, format), imported once per process; a pair without one is refused."""
    from toolkit.conversion.routes import check_supported

    row = check_supported(framework, fmt)
    backend = resolve(str(row.backend))
    if not isinstance(backend, Backend):
        raise TypeError(f"{row.backend} is not a conversion Backend")
    return backend
