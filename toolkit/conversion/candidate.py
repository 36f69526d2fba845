"""One candidate artifact: build it through its route, prove what it is, verify it against the float model.

``build_and_verify`` returns a :class:`~toolkit.conversion.run.Candidate` or a typed
:class:`~toolkit.conversion.run.Failure` and never raises for a recipe that merely failed, so one route failing
cannot abort the bundle. Only bad input (a :class:`UsageError`) propagates, and only for explicit recipes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.verification import verify
from toolkit.delivery.bundle import sha256_file
from toolkit.conversion import cache
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.host_timing import PairedTiming, Speed, host_cpu, is_this_host
from toolkit.conversion.io_align import align
from toolkit.conversion.run import Candidate, ConvertRun, Failure, FailureKind, failure
from toolkit.errors import ArtifactCrashed, ArtifactRefused, ConversionError, ToolkitError, UsageError
from toolkit.runtimes.inspection.share import artifact_share
from toolkit.quiet import native_stderr_silenced
from toolkit.model.artifact import ArtifactRecord
from toolkit.model.recipe import Recipe
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import ArtifactStatus, Precision, artifact_file_name
from toolkit.model.batching import FIXED_BATCH_NOTE, BatchVerification

if TYPE_CHECKING:
    from toolkit.runtimes.inspection import ModelInfo
    from toolkit.verification.outputs import VerificationResult

_log = logging.getLogger(__name__)


def _build(run: ConvertRun, request: ConversionRequest, output: Path) -> BuiltArtifact:
    from toolkit.conversion import registry

    reused = cache.reuse_build(run.builds, request.recipe, output)
    if reused is not None:
        return reused
    with native_stderr_silenced():
        built = registry.build(request, output)  # the route's backend, once its refusals are checked
    cache.keep_build(run.builds, request.recipe, built)
    return built


def _io_notes(source: Sequence[TensorSpec], artifact: Sequence[TensorSpec], order: Sequence[int], what: str) -> list[str]:
    """Where the artifact's tensor differs from the source's in name or dtype (the runner maps them)."""
    notes = []
    for spec, j in zip(source, order):
        other = artifact[j]
        if other.name != spec.name:
            notes.append(f"{what} {spec.name!r} is {other.name!r} in the artifact")
        if other.dtype != spec.dtype and other.quantization is None:
            notes.append(f"{what} {spec.name!r} is {other.dtype} in the artifact ({spec.dtype} in the source)")
    return notes


def _fp32_to_pair_with(run: ConvertRun, recipe: Recipe) -> Path | None:
    """The fp32 artifact of the format to time ``recipe``'s against in alternating rounds (``host_timing``), only
    where the profile is this host and the recipe runs on its CPU."""
    fp32 = run.caches.fp32.get(recipe.format)
    if (recipe.precision == Precision.FP32 or not isinstance(fp32, Candidate) or not is_this_host(run.policy.name)
            or run.backend(recipe.format).device_only(recipe, run.policy)):
        return None
    return fp32.built.path


@dataclass(frozen=True)
class _Measured:
    """What running a loaded artifact on the held-out samples found."""

    in_order: list[int]  # the artifact's input for each source input
    out_order: list[int]
    outputs: list[list[np.ndarray]]
    verdict: VerificationResult
    latency: float
    runtime: str
    timing: PairedTiming | None  # the paired comparison with fp32, on the host profile only
    batching: BatchVerification | None
    io_notes: list[str]


@dataclass(frozen=True)
class _Speed:
    """How the artifact's host timing reads: its status, notes and latencies."""

    status: ArtifactStatus
    notes: tuple[str, ...]
    slower: str | None
    latency: float
    base: float | None


def build_and_verify(run: ConvertRun, recipe: Recipe, *, explicit: bool) -> Candidate | Failure:
    """Build ``recipe``, check its label, load it in its runtime, verify it on the held-out samples, time it."""
    built = _built(run, recipe, explicit=explicit)
    if isinstance(built, Failure):
        return built
    recipe, artifact, info = built
    measured = _measure(run, recipe, artifact, info)
    if isinstance(measured, Failure):
        return measured
    failures = tuple(measured.verdict.failures) + tuple(measured.batching.failures() if measured.batching else ())
    speed = _speed(run, recipe, measured, failed=bool(failures))
    record = _record(run, recipe, artifact, info, measured, speed)
    return Candidate(recipe, explicit, artifact, record, measured.outputs, failures, speed.slower,
                     dict(info.op_counts))


def candidate_path(run: ConvertRun, recipe: Recipe) -> Path:
    """Where ``recipe``'s artifact is built in the run's scratch folder."""
    return run.scratch / f"candidate-{cache.recipe_key(recipe)[:10]}.{recipe.format}"


def _built(run: ConvertRun, recipe: Recipe, *, explicit: bool
           ) -> tuple[Recipe, BuiltArtifact, ModelInfo] | Failure:
    """The recipe's artifact, if its route builds it, the target's runtime loads it and it is what its label
    says; the recipe as built (a .tflite source taken as it is has the file's precision)."""
    from toolkit.runtimes.inspection import inspect_model

    try:
        built = _build(run, run.request(recipe), candidate_path(run, recipe))
    except UsageError as exc:
        if explicit:
            raise
        return failure(recipe, FailureKind.REFUSED, exc.message, exc.hint)
    except ArtifactRefused as exc:  # built, but its runtime refuses it: retried with the node it names in float
        crashed = isinstance(exc, ArtifactCrashed)
        return failure(recipe, FailureKind.CRASHED if crashed else FailureKind.DOES_NOT_RUN, exc.message, exc.hint)
    except ToolkitError as exc:
        if exc.__cause__ is not None:  # a third party's exception: its traceback under --debug (debug logging)
            _log.debug("%s: building failed", recipe.label, exc_info=exc)
        return failure(recipe, FailureKind.BUILD, exc.message, exc.hint)
    info = inspect_model(built.path)
    backend = run.backend(recipe.format)
    incompatible = backend.load_problems(built.path, run.policy)
    if incompatible:
        return failure(recipe, FailureKind.INCOMPATIBLE, f"the target's runtime cannot load it: {incompatible}")
    recipe = backend.as_built(recipe, info)  # a file taken as it is: its own precision
    if recipe.precision in (Precision.INT8, Precision.DYNAMIC) and info.quantized_ops == 0:
        return failure(recipe, FailureKind.NOT_QUANTIZED,
                       "quantization changed nothing: the artifact holds no quantized operators")
    return recipe, built, info


def _measure(run: ConvertRun, recipe: Recipe, built: BuiltArtifact, info: ModelInfo) -> _Measured | Failure:
    """Run the artifact in a child process (``crash_guard.measure``: a runtime's crash drops this candidate
    only), then judge its outputs here against the float reference."""
    from toolkit.conversion import crash_guard
    from toolkit.conversion.measure_child import MeasureJob, RunFailed, RunProblem, write_feeds

    source, data = run.source, run.data
    backend = run.backend(recipe.format)
    # the target's arithmetic where this host's differs (an ARM target's int8 ONNX on a saturating x86 host)
    numerics, numerics_note = backend.numerics(recipe, run.policy.arch)
    try:
        named = tuple(info.inputs[j].name for j in align(source.inputs, info.inputs, what="input"))
    except ConversionError:
        named = ()  # the child names the mismatch
    job = MeasureJob(built.path, recipe.threads or run.policy.threads, numerics, tuple(source.inputs),
                     tuple(source.outputs), write_feeds(data.heldout.feeds, run.scratch / "heldout-feeds.pkl"),
                     run.recurrent.pairs if run.recurrent else None, _fp32_to_pair_with(run, recipe),
                     run.dynamic_batch, named)
    result = crash_guard.measure(job, backend=backend, scratch=run.scratch)
    what = f"{recipe.precision} {backend.display}"
    if isinstance(result, crash_guard.Crash):
        if result.stack:
            _log.debug("%s: the Python stack when the runtime crashed (in its verification process):\n%s",
                       recipe.label, result.stack)
        return failure(recipe, FailureKind.CRASHED, result.reason(what))
    if isinstance(result, RunFailed):
        if result.traceback:  # the child's exception: its traceback under --debug (debug logging)
            _log.debug("%s: %s in its verification process:\n%s", recipe.label, result.stage, result.traceback)
        kind = {RunProblem.LOAD: FailureKind.DOES_NOT_RUN, RunProblem.SIGNATURE: FailureKind.SIGNATURE,
                RunProblem.RUN: FailureKind.DOES_NOT_RUN}[result.problem]
        return failure(recipe, kind, result.reason(), result.hint)
    recurrent = run.recurrent.with_candidate(result.steps) if run.recurrent and result.steps is not None else None
    verdict = verify.verify_outputs(
        run.reference, result.outputs, tolerance=run.policy.tolerance, task=run.task, labels=data.heldout.labels,
        metric=run.metric, output_names=[s.name for s in source.outputs], recurrent=recurrent, anchors=data.anchors,
    )
    inputs, outputs = result.session_inputs, result.session_outputs
    io_notes = _io_notes(source.inputs, inputs, result.in_order, "input") + _io_notes(
        source.outputs, outputs, result.out_order, "output") + ([numerics_note] if numerics_note else [])
    return _Measured(result.in_order, result.out_order, result.outputs, verdict, result.latency, result.runtime,
                     result.timing, result.batching, io_notes)


def _speed(run: ConvertRun, recipe: Recipe, measured: _Measured, *, failed: bool) -> _Speed:
    """The artifact's status and timing notes: the paired comparison decides where the profile is this host;
    elsewhere (or on an accelerator this host lacks) host latency decides nothing."""
    policy = run.policy
    status = ArtifactStatus.OUT_OF_TOLERANCE if failed else (
        ArtifactStatus.UNVERIFIED if measured.verdict.vacuous else ArtifactStatus.OK)
    latency = measured.latency
    if recipe.precision == Precision.FP32:
        run.caches.fp32_latency.setdefault(recipe.format, latency)
    base = run.caches.fp32_latency.get(recipe.format)
    device_only = run.backend(recipe.format).device_only(recipe, policy)
    timing = measured.timing
    if device_only:
        note = (f"timed on this host's CPU only; the device runs it on {', '.join(device_only)} "
                "(not available here), so it is not compared with fp32")
        ok = status == ArtifactStatus.OK
        return _Speed(ArtifactStatus.NO_SPEEDUP_MEASURED if ok else status, (note,), None, latency, base)
    if timing is not None:  # the profile is this host: the paired comparison decides
        described = timing.describe(measured.runtime)
        if status == ArtifactStatus.OK and timing.speed is not Speed.FASTER:
            status = ArtifactStatus(timing.speed.value)
        slower = described if timing.speed is Speed.SLOWER else None
        return _Speed(status, (described,), slower, timing.candidate_p50, timing.fp32_p50)
    notes: tuple[str, ...] = ()
    if recipe.precision != Precision.FP32 and not is_this_host(policy.name):
        notes = (f"host latency measured on {host_cpu()}, not the {policy.name} CPU: it decides nothing; "
                 "the device measures and selects (edgetk check)",)
    return _Speed(status, notes, None, latency, base)


def _record(run: ConvertRun, recipe: Recipe, built: BuiltArtifact, info: ModelInfo, measured: _Measured,
            speed: _Speed) -> ArtifactRecord:
    verdict, batching, policy = measured.verdict, measured.batching, run.policy
    return ArtifactRecord(
        file=artifact_file_name(recipe.precision, recipe.format),
        format=recipe.format,
        precision=recipe.precision,
        sha256=sha256_file(built.path),
        bytes=built.path.stat().st_size,
        inputs=tuple(info.inputs[j] for j in measured.in_order),
        outputs=tuple(info.outputs[j] for j in measured.out_order),
        verification=verdict.verification,
        host_latency_ms=speed.latency,
        fp32_latency_ms=speed.base,
        host_cpu=host_cpu(),
        runtime=measured.runtime,
        status=speed.status,
        recipe=recipe,
        float_nodes=built.float_nodes,
        execution_providers=recipe.execution_providers,
        provider_options={ep: dict(policy.provider_options[ep]) for ep in recipe.execution_providers
                          if ep in policy.provider_options},
        layout=built.layout,
        batching=batching,
        float_io=built.float_io,
        quantized=artifact_share(built.path, recipe.precision, built.float_nodes, recipe.nodes_to_exclude),
        pte=built.pte,
        notes=speed.notes + tuple(built.notes) + tuple(measured.io_notes)
        + ((f"exported with {built.exporter}",) if built.exporter else ())
        + ((FIXED_BATCH_NOTE,) if run.dynamic_batch and batching is None else ())
        + (("verified on random inputs: no data was given",) if run.data.synthetic else ())
        + ((f"verification proves nothing here: {verdict.vacuous}",) if verdict.vacuous else ()),
    )
