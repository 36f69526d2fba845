"""One candidate artifact: build it through its route, prove what it is, verify it against the float model.

``ConvertRun`` is the context every candidate of one run shares (the source, the data, the float reference,
the policy, the scratch folder, the fp32 latency per format...), so the stages take one object instead of
eight positional arguments. ``build_and_verify`` returns either a :class:`Candidate` (built, loaded, run,
measured: kept or dropped by the caller) or a :class:`Failure` (typed by :class:`FailureKind`, with the reason
and a workaround), never raises for a recipe that merely failed, so one route failing cannot abort the
bundle. Only bad input (a :class:`UsageError` the user must fix) propagates, and only for recipes the user
asked for explicitly.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.verification import verify
from toolkit.delivery.bundle import sha256_file
from toolkit.conversion import cache
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.data import RunData
from toolkit.conversion.host_timing import PairedTiming, Speed, host_cpu, is_this_host, paired_with_fp32
from toolkit.conversion.plan import Policy
from toolkit.errors import ConversionError, ToolkitError, UsageError
from toolkit.runtimes.inspection.share import artifact_share
from toolkit.quiet import native_stderr_silenced
from toolkit.sources import SourceModel
from toolkit.model.artifact import ArtifactRecord, Attempt
from toolkit.model.recipe import Recipe
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import ArtifactStatus, AttemptOutcome, Precision, artifact_file_name
from toolkit.model.batching import FIXED_BATCH_NOTE, batch_is_dynamic, output_step, verify_batches

Progress = Callable[[str], None]
MATMUL_OPS = frozenset({
    "MatMul", "Gemm", "LSTM", "GRU", "RNN", "Attention", "MultiHeadAttention", "Einsum", "MatMulInteger",
    "FULLY_CONNECTED", "BATCH_MATMUL", "UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM",
    "UNIDIRECTIONAL_SEQUENCE_RNN", "EMBEDDING_LOOKUP",
})
CONV_OPS = frozenset({"Conv", "ConvTranspose", "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "CONV_3D"})


class FailureKind(StrEnum):
    """Why a candidate never became an artifact; the workaround follows from the kind."""

    BUILD = "build"  # the converter or quantizer failed
    REFUSED = "refused"  # the route does not build this recipe (a UsageError of the route)
    INCOMPATIBLE = "incompatible"  # the target's runtime cannot load it (op versions)
    NOT_QUANTIZED = "not_quantized"  # an int8/dynamic label with no quantized operator inside
    SIGNATURE = "signature"  # the artifact's inputs/outputs do not match the source's
    DOES_NOT_RUN = "does_not_run"  # the runtime loads it but running it fails
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
    FailureKind.NOT_ATTEMPTED: "see the reason",
}


@dataclass(frozen=True)
class Failure:
    recipe: Recipe
    kind: FailureKind
    reason: str
    workaround: str

    def attempt(self, outcome: str = "failed") -> Attempt:
        return Attempt(self.recipe.to_dict(), AttemptOutcome(outcome), self.reason, workaround=self.workaround)


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

    def attempt(self, outcome: str, reason: str, *, workaround: str | None = None) -> Attempt:
        record = self.record
        metrics = {
            "verification": record.verification.to_dict() if record.verification else None,
            "host_latency_ms": record.host_latency_ms,
            "fp32_latency_ms": record.fp32_latency_ms,
            "bytes": record.bytes,
            "float_nodes": list(record.float_nodes),
        }
        return Attempt(self.recipe.to_dict(), AttemptOutcome(outcome), reason, file=record.file, metrics=metrics,
                       workaround=workaround)

    @property
    def matmul_dominated(self) -> bool:
        """More MatMul/Gemm/LSTM/GRU-like compute nodes than convolutions (transformers, recurrent models)."""
        matmul = sum(n for op, n in self.op_counts.items() if op in MATMUL_OPS)
        conv = sum(n for op, n in self.op_counts.items() if op in CONV_OPS)
        return matmul > 0 and matmul >= conv


@dataclass
class ConvertRun:
    """What every candidate of one conversion run shares."""

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
    fp32_latency: dict[str, float] = field(default_factory=dict)
    fp32: dict[str, Candidate | Failure] = field(default_factory=dict)  # per format: its fp32 outcome
    layer_tables: dict[str, Any] = field(default_factory=dict)  # recipe key -> layers.LayerTable (measured once)
    attempts: list[Attempt] = field(default_factory=list)

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
        )


def align(source: Sequence[TensorSpec], artifact: Sequence[TensorSpec], *, what: str) -> list[int]:
    """For each source tensor, the index of the artifact tensor that carries it.

    Converters rename tensors (``image`` -> ``serving_default_image:0``) and may reorder them; match by exact
    name, then by a name that contains the source name, then by position among the rest.
    """
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
    if recipe.format != "onnx" or not wanted:
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
    if policy.edgetpu and recipe.format == "tflite" and recipe.precision == "int8":
        device_only.append("the Edge TPU (once compiled by edgetpu_compiler)")
    return device_only


def _paired(run: ConvertRun, recipe: Recipe, infer: Callable[[Mapping[str, np.ndarray]], object]) -> PairedTiming | None:
    """The paired, interleaved comparison with the fp32 artifact of the format, made only when the profile is
    this host and the recipe runs on this host's CPU (toolkit.conversion.host_timing)."""
    fp32 = run.fp32.get(recipe.format)
    if (recipe.precision == "fp32" or not isinstance(fp32, Candidate) or not is_this_host(run.policy.name)
            or _device_only(recipe, run.policy)):
        return None
    return paired_with_fp32(fp32.built.path, threads=recipe.threads or run.policy.threads,
                            source_inputs=run.source.inputs, candidate=infer, feed=run.data.heldout.feeds[0],
                            align=align)


def build_and_verify(run: ConvertRun, recipe: Recipe, *, explicit: bool) -> Candidate | Failure:
    """Build ``recipe``, check its label, load it in its runtime, verify it on the held-out samples, time it."""
    from toolkit.runtimes.execution import open_session
    from toolkit.runtimes.inspection import inspect_model

    source, policy, data = run.source, run.policy, run.data
    request = run.request(recipe)
    output = run.scratch / f"candidate-{cache.recipe_key(recipe)[:10]}.{recipe.format}"
    try:
        built = _build(run, request, output)
    except UsageError as exc:
        if explicit:
            raise
        return failure(recipe, FailureKind.REFUSED, exc.message, exc.hint)
    except ToolkitError as exc:
        return failure(recipe, FailureKind.BUILD, exc.message, exc.hint)
    info = inspect_model(built.path)
    if recipe.format == "tflite":
        incompatible = _runtime_incompatibilities(built.path, policy)
        if incompatible:
            return failure(recipe, FailureKind.INCOMPATIBLE, f"the target's runtime cannot load it: {incompatible}")
    if source.framework == "tflite" and recipe.format == "tflite":  # taken as it is: the file's precision
        recipe = dataclasses.replace(recipe, precision=Precision(info.precision))
    if recipe.precision in ("int8", "dynamic") and info.quantized_ops == 0:
        return failure(recipe, FailureKind.NOT_QUANTIZED,
                       "quantization changed nothing: the artifact holds no quantized operators")
    try:
        session = open_session(built.path, threads=recipe.threads or policy.threads)
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
                run.reference, outputs, tolerance=policy.tolerance, task=run.task, labels=data.heldout.labels,
                metric=run.metric, output_names=[s.name for s in source.outputs], recurrent=recurrent,
                anchors=data.anchors,
            )
            latency = verify.median_latency_ms(infer, data.heldout.feeds[0])
            runtime = session.runtime
            timing = _paired(run, recipe, infer)  # only where the profile is this host
            batching = (verify_batches(infer, data.heldout.feeds, outputs,
                                       output_names=[s.name for s in source.outputs],
                                       steps=[output_step(session.outputs[j]) for j in out_order])
                        if run.dynamic_batch and batch_is_dynamic(session.inputs) else None)  # per sample at 4, 8
        except ToolkitError:
            raise
        except Exception as exc:  # noqa: BLE001 - a runtime's own error, reported as the artifact's failure
            return failure(recipe, FailureKind.DOES_NOT_RUN, f"the artifact does not run in its runtime: {exc}")
        io_notes = _io_notes(source.inputs, session.inputs, in_order, "input") + _io_notes(
            source.outputs, session.outputs, out_order, "output")
    finally:
        session.close()
    verification = verdict.verification
    failures = tuple(verdict.failures) + tuple(batching.failures() if batching else ())
    status = "out_of_tolerance" if failures else ("unverified" if verdict.vacuous else "ok")
    if recipe.precision == "fp32":
        run.fp32_latency.setdefault(recipe.format, latency)
    base = run.fp32_latency.get(recipe.format)
    slower = None
    device_only = _device_only(recipe, policy)
    notes: tuple[str, ...] = ()
    if device_only:
        # The device runs it on an accelerator this host lacks: CPU timings say nothing about that speed.
        notes = (f"timed on this host's CPU only; the device runs it on {', '.join(device_only)} "
                 "(not available here), so it is not compared with fp32",)
        status = status if status != "ok" else "no_speedup_measured"
    elif timing is not None:  # the profile is this host: the paired comparison decides
        notes = (timing.describe(runtime),)
        if timing.speed is Speed.SLOWER:
            slower = timing.describe(runtime)
        status = status if status != "ok" or timing.speed is Speed.FASTER else str(timing.speed)
        latency, base = timing.candidate_p50, timing.fp32_p50
    elif recipe.precision != "fp32" and not is_this_host(policy.name):
        notes = (f"host latency measured on {host_cpu()}, not the {policy.name} CPU: it decides nothing; "
                 "the device measures and selects (edgetk check)",)
    record = ArtifactRecord(
        file=artifact_file_name(recipe.precision, recipe.format),
        format=recipe.format,
        precision=recipe.precision,
        sha256=sha256_file(built.path),
        bytes=built.path.stat().st_size,
        inputs=tuple(info.inputs[j] for j in in_order),
        outputs=tuple(info.outputs[j] for j in out_order),
        verification=verification,
        host_latency_ms=latency,
        fp32_latency_ms=base,
        host_cpu=host_cpu(),
        runtime=runtime,
        status=ArtifactStatus(status),
        recipe=recipe.to_dict(),
        float_nodes=built.float_nodes,
        execution_providers=recipe.execution_providers,
        provider_options={ep: dict(policy.provider_options[ep]) for ep in recipe.execution_providers
                          if ep in policy.provider_options},
        layout=built.layout,
        batching=batching,
        float_io=built.float_io,
        quantized=artifact_share(built.path, recipe.precision, built.float_nodes, recipe.nodes_to_exclude),
        pte=built.pte,
        notes=notes + tuple(built.notes) + tuple(io_notes)
        + ((f"exported with {built.exporter}",) if built.exporter else ())
        + ((FIXED_BATCH_NOTE,) if run.dynamic_batch and batching is None else ())
        + (("verified on random inputs: no data was given",) if data.synthetic else ())
        + ((f"verification proves nothing here: {verdict.vacuous}",) if verdict.vacuous else ()),
    )
    return Candidate(recipe, explicit, built, record, outputs, failures, slower, dict(info.op_counts))
