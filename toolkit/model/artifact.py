"""An artifact inside a bundle, with everything proven about it, and the attempts that built (or failed) it.

Stdlib only. Each record has ``to_dict`` (the manifest's JSON); ``toolkit.model.reading`` reads them back against
the same fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from toolkit.model.batching import BatchVerification
from toolkit.model.quantized import QuantizedShare
from toolkit.model.recipe import Recipe
from toolkit.model.records import JsonDict, JsonObject, OutputMetrics, Record, SliceCheck, finite_or_none
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import (
    ArtifactStatus,
    AttemptOutcome,
    FloatIOReason,
    Format,
    Precision,
    TensorRole,
)


@dataclass(frozen=True)
class Verification:
    """An artifact's outputs against the float model's, on held-out inputs the calibration never saw."""

    max_abs_error: float
    mean_abs_error: float
    cosine_similarity: float
    top1_agreement: float | None  # None when the outputs are not a classifier's
    samples: int
    accuracy: float | None = None  # against labels (eval data key `y`), when given
    reference_accuracy: float | None = None  # the float model's accuracy on the same labels
    # toolkit.verification: the task the metrics were chosen for and how (--task, dataset.toml, inferred),
    # its metrics (recall, mask IoU, ...), every output (and slice) against its float range, the worst one
    # named, why the verdict proves nothing when it does not, and a --metric's result
    task: str | None = None
    task_source: str | None = None
    task_metrics: JsonObject = field(default_factory=dict, hash=False)
    outputs: tuple[OutputMetrics, ...] = ()
    worst: str | None = None
    vacuous: str | None = None
    user_metric: JsonObject | None = field(default=None, hash=False)

    def to_dict(self) -> JsonDict:
        return {
            "max_abs_error": finite_or_none(self.max_abs_error),
            "mean_abs_error": finite_or_none(self.mean_abs_error),
            "cosine_similarity": finite_or_none(self.cosine_similarity),
            "top1_agreement": finite_or_none(self.top1_agreement),
            "samples": self.samples,
            "accuracy": finite_or_none(self.accuracy),
            "reference_accuracy": finite_or_none(self.reference_accuracy),
            "task": self.task,
            "task_source": self.task_source,
            "task_metrics": {k: finite_or_none(v) if isinstance(v, float) else v for k, v in self.task_metrics.items()},
            "outputs": [o.to_dict() for o in self.outputs],
            "worst": self.worst,
            "vacuous": self.vacuous,
            "user_metric": dict(self.user_metric) if self.user_metric is not None else None,
        }


@dataclass(frozen=True)
class Golden:
    """Where the runner finds the outputs this artifact gave on the host, and how close the device must be."""

    outputs: str  # bundle-relative .npz path, keyed by output name
    atol: float
    # slices of outputs that mix ranges (box coordinates and scores), compared on the device against the
    # float reference (``reference``, bundle-relative) with the tolerance's per-slice limit
    slices: tuple[SliceCheck, ...] = ()
    reference: str | None = None

    def to_dict(self) -> JsonDict:
        out: JsonDict = {"outputs": self.outputs, "atol": self.atol}
        if self.slices:
            out["slices"] = [s.to_dict() for s in self.slices]
            out["reference"] = self.reference
        return out


@dataclass(frozen=True)
class FloatIO(Record):
    """An input or output of an INT8 artifact that is float32 where the recipe asked for int8/uint8 I/O."""

    name: str  # the source's input/output name
    role: TensorRole
    reason: FloatIOReason
    detail: str = ""  # the same in words, for people


@dataclass(frozen=True)
class PteRecord:
    """What an ExecuTorch artifact carries beside its file: how much of its graph the XNNPACK delegate took
    (edge-dialect operator nodes, counted before lowering) and the bundled program (``model.<p>.bpte``: a few
    held-out inputs with the float model's outputs) the device checks its own numbers with, at ``bundled_atol``
    (twice the error measured here on those inputs plus float rounding: ``conversion.pte_bundled``)."""

    delegated_nodes: int
    total_nodes: int
    bundled: str | None = None
    bundled_atol: float | None = None
    executorch_version: str | None = None  # the exporter's release: the device must run this one (version lock)

    @property
    def delegated_share(self) -> float:
        return self.delegated_nodes / self.total_nodes if self.total_nodes else 0.0

    def to_dict(self) -> JsonDict:
        return {"delegated_nodes": self.delegated_nodes, "total_nodes": self.total_nodes,
                "delegated_share": round(self.delegated_share, 4), "bundled": self.bundled,
                "bundled_atol": self.bundled_atol, "executorch_version": self.executorch_version}


@dataclass(frozen=True)
class ArtifactRecord:
    """One converted (or taken as-is) model file inside a bundle, with everything proven about it."""

    file: str
    format: Format
    precision: Precision
    sha256: str
    bytes: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    verification: Verification | None = None  # None: not verified (a bundle put together by hand, an old one)
    golden: Golden | None = None
    host_latency_ms: float | None = None  # median on this host, in `runtime`
    fp32_latency_ms: float | None = None  # the fp32 artifact of the same format, same runtime, same run
    host_cpu: str | None = None  # the CPU the host latencies were measured on (they inform only that CPU)
    runtime: str | None = None
    status: ArtifactStatus = ArtifactStatus.OK
    recipe: Recipe | None = None  # None: taken as it was, no recipe built it (written as {})
    float_nodes: tuple[str, ...] = ()  # nodes/ops kept in float by selective quantization
    execution_providers: tuple[str, ...] = ()  # ONNX Runtime providers the device should try, in order
    layout: str | None = None  # NCHW/NHWC of the artifact's image inputs, when it differs from the source's
    notes: tuple[str, ...] = ()
    # The artifact the device should run for this format: within the tolerance, not slower than fp32, first in
    # the profile's (or the user's) order of preference. At most one per format; none when every one failed.
    preferred: bool = False
    # ONNX Runtime options per provider (from the target profile), passed with each provider the device has.
    provider_options: Mapping[str, JsonObject] = field(default_factory=dict)
    delegate: str | None = None  # a TFLite delegate the artifact needs (``libedgetpu.so.1`` for Edge TPU models)
    float_io: tuple[FloatIO, ...] = ()  # empty: the I/O is as the recipe asked
    batching: BatchVerification | None = None  # None: the batch is not dynamic
    quantized: QuantizedShare | None = None  # None: not quantized, or written before it was recorded
    pte: PteRecord | None = None  # ExecuTorch artifacts: delegated share and bundled self-check


    def to_dict(self) -> JsonDict:
        return {
            "file": self.file,
            "format": self.format,
            "precision": self.precision,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "verification": self.verification.to_dict() if self.verification else None,
            "golden": self.golden.to_dict() if self.golden else None,
            "host_latency_ms": finite_or_none(self.host_latency_ms),
            "fp32_latency_ms": finite_or_none(self.fp32_latency_ms),
            "host_cpu": self.host_cpu,
            "runtime": self.runtime,
            "status": self.status,
            "recipe": self.recipe.to_dict() if self.recipe else {},
            "float_nodes": list(self.float_nodes),
            "execution_providers": list(self.execution_providers),
            "layout": self.layout,
            "notes": list(self.notes),
            "preferred": self.preferred,
            "provider_options": {k: dict(v) for k, v in self.provider_options.items()},
            "delegate": self.delegate,
            "float_io": [f.to_dict() for f in self.float_io],
            "batching": self.batching.to_dict() if self.batching else None,
            "quantized": self.quantized.to_dict() if self.quantized else None,
            **({"pte": self.pte.to_dict()} if self.pte else {}),
        }


@dataclass(frozen=True)
class Attempt:
    """One recipe the convert stage tried, and why its artifact was kept, dropped or never built."""

    recipe: Recipe
    outcome: AttemptOutcome
    reason: str
    file: str | None = None
    metrics: JsonObject | None = None
    workaround: str | None = None  # what the user can do about it, when the recipe failed or was dropped


    def to_dict(self) -> JsonDict:
        return {
            "recipe": self.recipe.to_dict(),
            "outcome": self.outcome,
            "reason": self.reason,
            "workaround": self.workaround,
            "file": self.file,
            "metrics": dict(self.metrics) if self.metrics is not None else None,
        }
