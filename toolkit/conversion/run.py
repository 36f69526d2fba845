"""What the candidates of one conversion run share (``ConvertRun``: source, data, float reference, policy,
scratch folder, the backend of each format, and :class:`RunCaches`: what the run measures once), and what each
became: a :class:`Candidate` (built, loaded, run, measured) or a :class:`Failure` (typed by :class:`FailureKind`,
with the reason and a workaround).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import numpy as np

from toolkit.verification import verify
from toolkit.conversion.backend import Backend, backend_for
from toolkit.conversion.base import CONV_OPS, MATMUL_OPS, BuiltArtifact, ConversionRequest, FloatExports
from toolkit.conversion.layers import LayerTable
from toolkit.conversion.data import RunData
from toolkit.conversion.policy import Policy
from toolkit.sources import SourceModel
from toolkit.model.artifact import ArtifactRecord, Attempt
from toolkit.model.recipe import Recipe
from toolkit.model.vocabulary import AttemptOutcome, Format

Progress = Callable[[str], None]


class FailureKind(StrEnum):
    """Why a candidate never became an artifact; the workaround follows from the kind."""

    BUILD = "build"  # the converter or quantizer failed
    REFUSED = "refused"  # the route does not build this recipe (a UsageError of the route)
    INCOMPATIBLE = "incompatible"  # the target's runtime cannot load it (op versions)
    NOT_QUANTIZED = "not_quantized"  # an int8/dynamic label with no quantized operator inside
    SIGNATURE = "signature"  # the artifact's inputs/outputs do not match the source's
    DOES_NOT_RUN = "does_not_run"  # the runtime loads it but running it fails
    CRASHED = "crashed"  # the runtime died loading or running it (a signal), in a child process
    NOT_ATTEMPTED = "not_attempted"  # a precondition failed (fp32 of the format failed, model family)


WORKAROUNDS: Mapping[FailureKind, str] = {
    FailureKind.BUILD: "run with --debug for the converter's full output; another --precision or --format may work",
    FailureKind.REFUSED: "use the route the message names",
    FailureKind.INCOMPATIBLE: "ask for another --precision (full int8 loads everywhere), or pick a --target whose "
    "runtimes are newer",
    FailureKind.NOT_QUANTIZED: "ship the fp32/fp16 artifact instead, or check nodes_to_exclude",
    FailureKind.SIGNATURE: "use the other --format, or re-export the model so that every input is a real input "
    "(constants folded)",
    FailureKind.DOES_NOT_RUN: "use another --precision for this format, or run with --debug",
    FailureKind.CRASHED: "use another --precision or --format; the runtime itself has a bug on this artifact",
    FailureKind.NOT_ATTEMPTED: "see the reason",
}


@dataclass(frozen=True)
class Failure:
    recipe: Recipe
    kind: FailureKind
    reason: str
    workaround: str

    def attempt(self, outcome: AttemptOutcome = AttemptOutcome.FAILED) -> Attempt:
        return Attempt(self.recipe, outcome, self.reason, workaround=self.workaround)


FP32_OUT_OF_TOLERANCE_WORKAROUND = (
    "an fp32 artifact should match its source: check the eval data and --input-shape, try the other --format, or "
    "loosen the profile's [tolerance] if it is stricter than float rounding allows"
)
OUT_OF_TOLERANCE_WORKAROUND = (
    "the profile's next recipe ships instead; to ship this one anyway (marked out_of_tolerance) ask for it with "
    "--precision/--format, or loosen the profile's [tolerance] in a --targets-dir profile"
)


def failure(recipe: Recipe, kind: FailureKind, reason: str, hint: str | None = None) -> Failure:
    return Failure(recipe, kind, reason, hint or WORKAROUNDS[kind])


@dataclass(frozen=True)
class Candidate:
    """A built artifact that loads and runs, with its verification and timing."""

    recipe: Recipe
    explicit: bool
    built: BuiltArtifact
    record: ArtifactRecord
    outputs: list[list[np.ndarray]]
    failures: tuple[str, ...]  # accuracy: beyond the tolerance
    slower: str | None = None  # speed: slower than fp32 in the same runtime
    op_counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        return list(self.failures) + ([self.slower] if self.slower else [])

    def attempt(self, outcome: AttemptOutcome, reason: str, *, workaround: str | None = None) -> Attempt:
        record = self.record
        metrics = {
            "verification": record.verification.to_dict() if record.verification else None,
            "host_latency_ms": record.host_latency_ms,
            "fp32_latency_ms": record.fp32_latency_ms,
            "bytes": record.bytes,
            "float_nodes": list(record.float_nodes),
        }
        return Attempt(self.recipe, outcome, reason, file=record.file, metrics=metrics,
                       workaround=workaround)

    @property
    def matmul_dominated(self) -> bool:
        """More MatMul/Gemm/LSTM/GRU-like compute nodes than convolutions (transformers, recurrent models)."""
        matmul = sum(n for op, n in self.op_counts.items() if op in MATMUL_OPS)
        conv = sum(n for op, n in self.op_counts.items() if op in CONV_OPS)
        return matmul > 0 and matmul >= conv


@dataclass
class RunCaches:
    """What one run measures once and its recipes share; the pipeline owns it (``ConvertRun.caches``)."""

    fp32: dict[Format, Candidate | Failure] = field(default_factory=dict)  # per format: its fp32 outcome
    fp32_latency: dict[Format, float] = field(default_factory=dict)  # per format: the fp32 artifact's host p50
    layer_tables: dict[str, LayerTable] = field(default_factory=dict)  # recipe key -> its full INT8 layer table
    exports: FloatExports = field(default_factory=FloatExports)  # the float ONNX exports, one per opset


@dataclass(frozen=True)
class ConvertRun:
    """One conversion run: what its candidates share. Its fields stay as ``pipeline._start`` made them; what the
    run learns goes into ``caches`` and ``attempts`` (the manifest's list, in order)."""

    source: SourceModel
    data: RunData
    reference: list[list[np.ndarray]]
    policy: Policy
    scratch: Path
    dynamic_batch: bool = False
    builds: Path | None = None  # the build cache (ConvertOptions.workdir), keyed
    progress: Progress = lambda message: None
    task: verify.Task | verify.TaskChoice | None = None  # --task or dataset.toml; None: inferred (the manifest says how)
    metric: verify.UserMetric | None = None  # --metric, gating like the built-in metrics
    recurrent: verify.RecurrentRun | None = None  # state pairs + the float model's sequence run (step models)
    caches: RunCaches = field(default_factory=RunCaches)
    attempts: list[Attempt] = field(default_factory=list)

    def backend(self, fmt: Format) -> Backend:
        """The backend of the route from this run's source to ``fmt`` (resolved once per process)."""
        return backend_for(self.source.framework, fmt)

    def request(self, recipe: Recipe) -> ConversionRequest:
        # one float ONNX export per opset: recipes of one profile may ask for different opsets
        workdir = self.scratch / f"opset-{recipe.opset or 'default'}"
        workdir.mkdir(exist_ok=True)
        return ConversionRequest(
            source=self.source,
            recipe=recipe,
            input_shapes=self.data.shapes,
            calibration=self.data.calibration.feeds,
            workdir=workdir,
            max_opset=self.policy.max_opset,
            dynamic_batch=self.dynamic_batch,
            exports=self.caches.exports,
        )
