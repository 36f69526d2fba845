"""The schema of a bundle's ``manifest.json`` (docs/schemas/convert.md), and :func:`read_manifest`, which
turns a validated one into the frozen :class:`~toolkit.model.manifest.Manifest` the stages share.

Unknown keys are refused: a manifest is written by ``edgetk convert`` and read under the same contract
(``schema_version``); a key this edgetk does not know is a hand edit gone wrong, or comes from a newer edgetk,
whose ``schema_version`` is refused first ("upgrade edge-toolkit"). Free-form tables (``recipe``, ``config``,
``metrics``, ...) are not checked inside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated

from pydantic import ValidationError

from toolkit.errors import UsageError
from toolkit.model.policy import CheckPolicy, RegressionPolicy
from toolkit.model.schemas.fields import Bool, Int, Number, Str, Table, choice
from toolkit.model.schemas.problems import problems
from toolkit.model.schemas.quantized import QuantizedM, read_quantized
from toolkit.model.schemas.verification import (
    Free,
    GoldenM,
    Real,
    VerificationM,
    float_or_none,
    nan_if_null,
    read_golden,
    read_verification,
)
from toolkit.model.artifact import ArtifactRecord, Attempt, FloatIO, PteRecord
from toolkit.model.manifest import (
    MANIFEST_SCHEMA_VERSION,
    CalibrationRef,
    FileRef,
    Manifest,
    Preprocessing,
    RunnerRef,
    SourceRef,
)
from toolkit.model.tensors import Quantization, TensorSpec
from toolkit.model.vocabulary import (
    ArtifactStatus,
    AttemptOutcome,
    FloatIOReason,
    Format,
    Framework,
    Precision,
    TensorRole,
)
from toolkit.model.batching import BatchCheck, BatchVerification

DOCS = "docs/schemas/convert.md"
REBUILD = "Rebuild the bundle with `edgetk convert`"


class QuantizationM(Table):
    scale: list[Number]
    zero_point: list[Int]
    axis: Int | None = None


class TensorM(Table):
    name: Str
    shape: list[Int | None]
    dtype: Str
    quantization: QuantizationM | None = None


class FloatIOM(Table):
    name: Str
    role: Annotated[Str, choice(TensorRole.values(), "role")]
    reason: Annotated[Str, choice(FloatIOReason.values(), "reason")]
    detail: Str = ""


class BatchCheckM(Table):
    batch: Int
    max_abs_error: Real = None
    limit: Number
    output: Str | None = None
    ok: Bool | None = None  # derived from the two numbers when read


class BatchingM(Table):
    checks: list[BatchCheckM]
    problem: Str | None = None
    ok: Bool | None = None  # derived when read


class PteM(Table):
    delegated_nodes: Int
    total_nodes: Int
    delegated_share: Real = None  # derived when read
    bundled: Str | None = None
    bundled_atol: Real = None


class ArtifactM(Table):
    file: Str
    format: Annotated[Str, choice(Format.values(), "format")]
    precision: Annotated[Str, choice(Precision.values(), "precision")]
    sha256: Str
    bytes: Int
    inputs: list[TensorM]
    outputs: list[TensorM]
    verification: VerificationM | None = None
    golden: GoldenM | None = None
    host_latency_ms: Real = None
    fp32_latency_ms: Real = None
    host_cpu: Str | None = None
    runtime: Str | None = None
    status: Annotated[Str, choice(ArtifactStatus.values(), "status")] | None = None
    recipe: Free | None = None
    float_nodes: list[Str] | None = None
    execution_providers: list[Str] | None = None
    layout: Str | None = None
    notes: list[Str] | None = None
    preferred: Bool | None = None
    provider_options: dict[str, Free] | None = None
    delegate: Str | None = None
    float_io: list[FloatIOM] | None = None
    batching: BatchingM | None = None
    quantized: QuantizedM | None = None
    pte: PteM | None = None


class AttemptM(Table):
    recipe: Free
    outcome: Annotated[Str, choice(AttemptOutcome.values(), "outcome")]
    reason: Str
    file: Str | None = None
    metrics: Free | None = None
    workaround: Str | None = None


class SourceM(Table):
    path: Str
    sha256: Str
    framework: Annotated[Str, choice(Framework.values(), "framework")]


class TargetM(Table):
    name: Str | None = None
    arch: Str | None = None


class PreprocessingM(Table):
    layout: Str | None = None
    color_order: Str | None = None
    mean: list[Number] | None = None
    std: list[Number] | None = None
    scale: Number | None = None
    dtype: Str | None = None
    size: list[Int] | None = None  # [height, width]


class CalibrationM(Table):
    path: Str
    sha256: Str
    samples: Int


class RunnerM(Table):
    file: Str
    sha256: Str


class FileRefM(Table):
    file: Str
    sha256: Str
    bytes: Int


_REGRESSION = RegressionPolicy()


class RegressionM(Table):
    min_slowdown_pct: Number = _REGRESSION.min_slowdown_pct
    min_slowdown_ms: Number = _REGRESSION.min_slowdown_ms
    alpha: Number = _REGRESSION.alpha
    baseline_checks: Int = _REGRESSION.baseline_checks
    min_baseline_checks: Int = _REGRESSION.min_baseline_checks


class PlacementM(Table):
    format: Str
    on: Str
    min_nodes_pct: Number = 100.0
    artifacts: Str = "*"


class CheckPolicyM(Table):
    target: Str | None = None
    latency_budget_ms: Number | None = None
    regression: RegressionM | None = None
    placement: list[PlacementM] | None = None
    tolerance: dict[str, Number] | None = None
    min_throughput_ips: Number | None = None


class ManifestM(Table):
    schema_version: Int
    name: Str
    created_at: Str
    toolkit_version: Str
    source: SourceM
    target: TargetM | None = None
    preprocessing: PreprocessingM | None = None
    labels: list[Str] | None = None
    calibration: CalibrationM | None = None
    golden_inputs: Str | None = None
    artifacts: list[ArtifactM]
    attempts: list[AttemptM] | None = None
    runtime_preferences: Free | None = None
    runner: RunnerM | None = None
    config: Free | None = None
    check_policy: CheckPolicyM | None = None
    on_demand: list[FileRefM] | None = None  # schema 3


def read_manifest(data: object, where: str = "manifest.json") -> Manifest:
    """``data`` (a parsed ``manifest.json``) as a :class:`Manifest`, or a UsageError naming ``where``, the key
    and the fix. A ``schema_version`` newer than this edgetk's is refused before anything else."""
    version = data.get("schema_version") if isinstance(data, Mapping) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > MANIFEST_SCHEMA_VERSION:
        raise UsageError(
            f"{where}: schema_version {version} is newer than this edgetk understands "
            f"({MANIFEST_SCHEMA_VERSION}).",
            hint="Upgrade edge-toolkit, or rebuild the bundle with this version.",
        )
    try:
        model = ManifestM.model_validate(data)
    except ValidationError as exc:
        first = problems(exc, ManifestM, docs=DOCS)[0]
        if first.kind == "missing":
            fix = f"{REBUILD} ({DOCS} lists the keys)."
        elif first.kind == "extra_forbidden":
            fix = f"{first.fix} Or rebuild the bundle with `edgetk convert` (a newer edgetk's? upgrade)."
        else:
            fix = f"{first.fix} Or rebuild the bundle with `edgetk convert`."
        raise dataclasses.replace(first, fix=fix).error(where) from None
    try:
        return _manifest(model)
    except UsageError as exc:  # a rule the frozen types keep themselves (a check policy's bounds)
        raise UsageError(f"{where}: {exc.message}", hint=exc.hint or f"{REBUILD}.") from None


def _manifest(m: ManifestM) -> Manifest:
    target = m.target or TargetM()
    pre = m.preprocessing
    return Manifest(
        schema_version=m.schema_version,
        name=m.name,
        created_at=m.created_at,
        toolkit_version=m.toolkit_version,
        source=SourceRef(path=m.source.path, sha256=m.source.sha256, framework=Framework(m.source.framework)),
        target=target.name,
        target_arch=target.arch,
        preprocessing=Preprocessing(
            layout=pre.layout, color_order=pre.color_order,
            mean=tuple(float(v) for v in pre.mean) if pre.mean is not None else None,
            std=tuple(float(v) for v in pre.std) if pre.std is not None else None,
            scale=float_or_none(pre.scale), dtype=pre.dtype,
            size=(pre.size[0], pre.size[1]) if pre.size is not None and len(pre.size) == 2 else None,
        ) if pre is not None else None,
        labels=tuple(m.labels) if m.labels is not None else None,
        calibration=CalibrationRef(path=m.calibration.path, sha256=m.calibration.sha256,
                                   samples=m.calibration.samples) if m.calibration else None,
        golden_inputs=m.golden_inputs,
        artifacts=tuple(_artifact(a) for a in m.artifacts),
        attempts=tuple(Attempt(recipe=a.recipe, outcome=AttemptOutcome(a.outcome), reason=a.reason, file=a.file,
                               metrics=a.metrics, workaround=a.workaround) for a in m.attempts or ()),
        runtime_preferences=m.runtime_preferences or {},
        runner=RunnerRef(file=m.runner.file, sha256=m.runner.sha256) if m.runner else None,
        config=m.config or {},
        check_policy=CheckPolicy.from_dict(m.check_policy.model_dump(exclude_none=True))
        if m.check_policy is not None else None,
        on_demand=tuple(FileRef(file=f.file, sha256=f.sha256, bytes=f.bytes) for f in m.on_demand or ()),
    )


def _tensor(t: TensorM) -> TensorSpec:
    q = t.quantization
    return TensorSpec(name=t.name, shape=tuple(t.shape), dtype=t.dtype, quantization=Quantization(
        tuple(float(s) for s in q.scale), tuple(q.zero_point), q.axis) if q is not None else None)


def _artifact(a: ArtifactM) -> ArtifactRecord:
    return ArtifactRecord(
        file=a.file, format=Format(a.format), precision=Precision(a.precision), sha256=a.sha256, bytes=a.bytes,
        inputs=tuple(_tensor(t) for t in a.inputs), outputs=tuple(_tensor(t) for t in a.outputs),
        verification=read_verification(a.verification) if a.verification is not None else None,
        golden=read_golden(a.golden) if a.golden is not None else None,
        host_latency_ms=float_or_none(a.host_latency_ms), fp32_latency_ms=float_or_none(a.fp32_latency_ms), host_cpu=a.host_cpu,
        runtime=a.runtime,
        status=ArtifactStatus(a.status or ArtifactStatus.OK), recipe=a.recipe or {}, float_nodes=tuple(a.float_nodes or ()),
        execution_providers=tuple(a.execution_providers or ()), layout=a.layout, notes=tuple(a.notes or ()),
        preferred=bool(a.preferred), provider_options=a.provider_options or {}, delegate=a.delegate,
        float_io=tuple(FloatIO(f.name, TensorRole(f.role), FloatIOReason(f.reason), f.detail) for f in a.float_io or ()),
        batching=_batching(a.batching) if a.batching is not None else None,
        quantized=read_quantized(a.quantized),
        pte=PteRecord(a.pte.delegated_nodes, a.pte.total_nodes, a.pte.bundled, float_or_none(a.pte.bundled_atol))
        if a.pte is not None else None,
    )


def _batching(b: BatchingM) -> BatchVerification:
    return BatchVerification(
        tuple(BatchCheck(c.batch, nan_if_null(c.max_abs_error), float(c.limit), c.output) for c in b.checks), b.problem)
