"""One candidate artifact: build it through its route, prove what it is, verify it against the float model.

``build_and_verify`` returns a :class:`~toolkit.conversion.run.Candidate` or a typed
:class:`~toolkit.conversion.run.Failure` and never raises for a recipe that merely failed, so one route failing
cannot abort the bundle. Only bad input (a :class:`UsageError`) propagates, and only for explicit recipes.
"""

from __future__ import annotations

import logging
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.verification import verify
from toolkit.delivery.bundle import sha256_file
from toolkit.conversion import cache
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.host_timing import PairedTiming, Speed, host_cpu, is_this_host, paired_with_fp32
from toolkit.conversion.int8_saturation import X64_QUANT_PRECISION_NOTE, target_numerics
from toolkit.conversion.plan import Policy
from toolkit.conversion.run import WORKAROUNDS, Candidate, ConvertRun, Failure, FailureKind, failure
from toolkit.errors import ArtifactCrashed, ArtifactRefused, ConversionError, ToolkitError, UsageError, origin
from toolkit.runtimes.inspection.share import artifact_share
from toolkit.quiet import native_stderr_silenced
from toolkit.model.artifact import ArtifactRecord
from toolkit.model.recipe import Recipe
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import ArtifactStatus, Format, Framework, Precision, artifact_file_name
from toolkit.model.batching import FIXED_BATCH_NOTE, BatchVerification, batch_is_dynamic, output_step, verify_batches

if TYPE_CHECKING:
    from toolkit.runtimes.inspection import ModelInfo
    from toolkit.verification.outputs import VerificationResult

_log = logging.getLogger(__name__)


_FORMAT_NAMES = {Format.TFLITE: "TFLite", Format.ONNX: "ONNX", Format.PTE: ".pte"}


def align(source: Sequence[TensorSpec], artifact: Sequence[TensorSpec], *, what: str) -> list[int]:
    """For each source tensor, the index of the artifact tensor that carries it: converters rename tensors (``image``
    -> ``serving_default_image:0``) and may reorder them; match by name, then containment, then position."""
    if len(source) != len(artifact):
        extra = [a.name for a in artifact if a.name not in {s.name for s in source}]
        raise ConversionError(
            f"The artifact has {len(artifact)} {what}s but the source model has {len(source)}"
            + (f" (extra: {', '.join(extra[:4])})" if extra else "")
            + ": the converter changed the model's signature.",
            hint=WORKAROUNDS[FailureKind.SIGNATURE],
        )
    order: list[int | None] = [None] * len(source)
    free = list(range(len(artifact)))
    for matcher in (
        lambda s, a: a.name == s.name,
        lambda s, a: bool(s.name) and re.search(rf"(^|[^A-Za-z0-9]){re.escape(s.name)}([^A-Za-z0-9]|$)", a.name)
        is not None,
    ):
        for i, spec in enumerate(source):
            if order[i] is None:
                hits = [j for j in free if matcher(spec, artifact[j])]
                if len(hits) == 1:
                    order[i] = hits[0]
                    free.remove(hits[0])
    for i in range(len(source)):
        if order[i] is None:
            order[i] = free.pop(0)
    return [int(j) for j in order if j is not None]


def _runtime_incompatibilities(path: Path, policy: Policy) -> str:
    """Why a bounded TFLite runtime of the profile (tflite-runtime 2.14) cannot load ``path``; "" if it can."""
    from toolkit.runtimes.compat import tflite_incompatibilities

    reasons = []
    for runtime, max_version in policy.tflite_bounds:
        problems = tflite_incompatibilities(path, runtime, max_version)
        if problems:
            reasons.append(f"{runtime} <= {max_version} does not know {', '.join(problems)}")
    return "; ".join(reasons)


def _device_only_providers(recipe: Recipe) -> tuple[str, ...]:
    """The recipe's accelerator providers this host's onnxruntime lacks (TensorRT/CUDA on a CPU-only host)."""
    wanted = [ep for ep in recipe.execution_providers if ep != "CPUExecutionProvider"]
    if recipe.format != Format.ONNX or not wanted:
        return ()
    import onnxruntime

    available = set(onnxruntime.get_available_providers())
    return tuple(ep for ep in wanted if ep not in available)


def _build(run: ConvertRun, request: ConversionRequest, output: Path) -> BuiltArtifact:
    from toolkit.conversion import registry

    reused = cache.reuse_build(run.builds, request.recipe, output)
    if reused is not None:
        return reused
    with native_stderr_silenced():
        built = registry.build(request, output)
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


def _device_only(recipe: Recipe, policy: Policy) -> list[str]:
    """Where the device runs ``recipe`` on an accelerator this host lacks (its CPU timings say nothing)."""
    device_only = list(_device_only_providers(recipe))
    if policy.edgetpu and recipe.format == Format.TFLITE and recipe.precision == Precision.INT8:
        device_only.append("the Edge TPU (once compiled by edgetpu_compiler)")
    return device_only


def _paired(run: ConvertRun, recipe: Recipe, infer: Callable[[Mapping[str, np.ndarray]], object]) -> PairedTiming | None:
    """The paired comparison with fp32 of the format, only where the profile is this host and the recipe runs on
    its CPU (``host_timing``)."""
    fp32 = run.fp32.get(recipe.format)
    if (recipe.precision == Precision.FP32 or not isinstance(fp32, Candidate) or not is_this_host(run.policy.name)
            or _device_only(recipe, run.policy)):
        return None
    return paired_with_fp32(fp32.built.path, threads=recipe.threads or run.policy.threads,
                            source_inputs=run.source.inputs, candidate=infer, feed=run.data.heldout.feeds[0],
                            align=align)


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
    measured = _crashed(run, recipe, artifact.path, info) or _measure(run, recipe, artifact)
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
    if recipe.format == Format.TFLITE:
        incompatible = _runtime_incompatibilities(built.path, run.policy)
        if incompatible:
            return failure(recipe, FailureKind.INCOMPATIBLE, f"the target's runtime cannot load it: {incompatible}")
        if run.source.framework == Framework.TFLITE:  # taken as it is: the file's precision
            recipe = dataclasses.replace(recipe, precision=info.precision)
    if recipe.precision in (Precision.INT8, Precision.DYNAMIC) and info.quantized_ops == 0:
        return failure(recipe, FailureKind.NOT_QUANTIZED,
                       "quantization changed nothing: the artifact holds no quantized operators")
    return recipe, built, info


def _crashed(run: ConvertRun, recipe: Recipe, path: Path, info: ModelInfo) -> Failure | None:
    """A failure when the artifact's first load and inference crash its runtime in a child (``crash_guard``)."""
    from toolkit.conversion import crash_guard

    try:
        order = align(run.source.inputs, info.inputs, what="input")
    except ConversionError:
        return None  # the in-process load names the mismatch
    feed = {info.inputs[j].name: run.data.heldout.feeds[0][spec.name] for spec, j in zip(run.source.inputs, order)}
    crash = crash_guard.first_run(path, feed, artifact_format=recipe.format,
                                  threads=recipe.threads or run.policy.threads, scratch=run.scratch)
    if crash is None:
        return None
    what = f"{recipe.precision} {_FORMAT_NAMES[recipe.format]}"
    return failure(recipe, FailureKind.CRASHED, crash.reason(what))


def _measure(run: ConvertRun, recipe: Recipe, built: BuiltArtifact) -> _Measured | Failure:
    from toolkit.runtimes.execution import open_session

    source, data = run.source, run.data
    numerics = target_numerics(recipe, run.policy.arch)  # the target's int8 arithmetic where this host's differs
    try:
        session = open_session(built.path, threads=recipe.threads or run.policy.threads, config=numerics)
    except Exception as exc:  # noqa: BLE001 - the runtime refuses the file: this artifact's failure only
        message = exc.message if isinstance(exc, ToolkitError) else f"{type(exc).__name__}: {exc}"
        return failure(recipe, FailureKind.DOES_NOT_RUN, f"its runtime cannot load it: {message}",
                       exc.hint if isinstance(exc, ToolkitError) else None)
    try:
        try:
            in_order = align(source.inputs, session.inputs, what="input")
            out_order = align(source.outputs, session.outputs, what="output")
        except ConversionError as exc:
            return failure(recipe, FailureKind.SIGNATURE, exc.message)

        def infer(feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            native = session.run({session.inputs[j].name: feed[spec.name] for spec, j in zip(source.inputs, in_order)})
            return [native[j] for j in out_order]

        try:
            outputs = verify.run_all(infer, data.heldout.feeds)
            recurrent = (run.recurrent.with_candidate(verify.run_steps(infer, data.heldout.feeds, run.recurrent.pairs))
                         if run.recurrent else None)  # a step model: also over one sequence, its state fed back
            verdict = verify.verify_outputs(
                run.reference, outputs, tolerance=run.policy.tolerance, task=run.task, labels=data.heldout.labels,
                metric=run.metric, output_names=[s.name for s in source.outputs], recurrent=recurrent,
                anchors=data.anchors,
            )
            latency = verify.median_latency_ms(infer, data.heldout.feeds[0])
            timing = _paired(run, recipe, infer)  # only where the profile is this host
            batching = (verify_batches(infer, data.heldout.feeds, outputs,
                                       output_names=[s.name for s in source.outputs],
                                       steps=[output_step(session.outputs[j]) for j in out_order])
                        if run.dynamic_batch and batch_is_dynamic(session.inputs) else None)  # per sample at 4, 8
        except ToolkitError:
            raise
        except Exception as exc:  # noqa: BLE001 - a runtime's own error, reported as the artifact's failure
            where = origin(exc)
            return failure(recipe, FailureKind.DOES_NOT_RUN, f"the artifact does not run in its runtime: {exc}"
                           + (f" ({type(exc).__name__} raised in {where})" if where else ""))
        io_notes = _io_notes(source.inputs, session.inputs, in_order, "input") + _io_notes(
            source.outputs, session.outputs, out_order, "output") + ([X64_QUANT_PRECISION_NOTE] if numerics else [])
        return _Measured(in_order, out_order, outputs, verdict, latency, session.runtime, timing, batching, io_notes)
    finally:
        session.close()


def _speed(run: ConvertRun, recipe: Recipe, measured: _Measured, *, failed: bool) -> _Speed:
    """The artifact's status and timing notes: the paired comparison decides where the profile is this host;
    elsewhere (or on an accelerator this host lacks) host latency decides nothing."""
    policy = run.policy
    status = ArtifactStatus.OUT_OF_TOLERANCE if failed else (
        ArtifactStatus.UNVERIFIED if measured.verdict.vacuous else ArtifactStatus.OK)
    latency = measured.latency
    if recipe.precision == Precision.FP32:
        run.fp32_latency.setdefault(recipe.format, latency)
    base = run.fp32_latency.get(recipe.format)
    device_only = _device_only(recipe, policy)
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
