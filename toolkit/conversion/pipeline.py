"""The convert stage: source + data + target profile -> a verified bundle directory.

For every recipe (the profile's, in its order of preference, or the ones the user asked for) the stage builds
the artifact, proves it is what its label says, verifies it on held-out inputs against the float model, times
it against fp32 of its format, and keeps or drops it with the reason. An INT8 recipe that breaks the
tolerance is retried with 7-bit weights where only this host's x86 kernels saturate (ONNX, ``saturation_retry``),
with its worst layers in float, then (MatMul/RNN-heavy models) as dynamic INT8, before
the next recipe. What the user asked for explicitly is never silently changed: it ships, marked. One recipe
failing never aborts the bundle: failures are listed in the manifest's ``attempts``; the stage fails (exit 3)
only when nothing survived. The jobs live in ``plan``, ``data``, ``candidate``, ``selective``, ``cache``,
``edgetpu`` and ``write``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.verification import verify
from toolkit.delivery.bundle import read_bundle, staging_dir
from toolkit.conversion import cache, saturation_retry
from toolkit.conversion.base import CONV_OPS, MATMUL_OPS
from toolkit.conversion.candidate import build_and_verify
from toolkit.conversion.run import (
    FP32_OUT_OF_TOLERANCE_WORKAROUND, OUT_OF_TOLERANCE_WORKAROUND, Candidate, ConvertRun, Failure, FailureKind,
    Progress, failure,
)
from toolkit.conversion.data import prepare_data
from toolkit.conversion.plan import (
    Plan, PlannedRecipe, When, bundle_name, detect_is_factory, plan_recipes, validate_name,
)
from toolkit.conversion.policy import Policy, policy_for
from toolkit.conversion.runtime_retry import retry as runtime_retry
from toolkit.conversion.selective import selective
from toolkit.conversion.write import write_bundle
from toolkit.errors import ConversionError, ToolkitError, UsageError
from toolkit.model.options import ConvertOptions  # the one definition (the CLI and the API share it)
from toolkit.sources import SourceModel, detect_framework, open_source
from toolkit.model.artifact import Attempt
from toolkit.model.recipe import Recipe
from toolkit.model.manifest import Manifest
from toolkit.model.vocabulary import AttemptOutcome, Framework, Precision

if TYPE_CHECKING:
    from toolkit.model.targets import TargetProfile

__all__ = ["ConvertOptions", "ConvertResult", "bundle_name", "convert_bundle", "detect_is_factory", "validate_name"]

def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ConvertResult:
    bundle_dir: Path
    manifest: Manifest
    cached: bool = False

    def to_dict(self) -> dict[str, object]:
        """The document ``edgetk convert --json`` prints: the bundle's path, whether it came from the cache,
        and the manifest's keys."""
        return {"bundle": str(self.bundle_dir), "cached": self.cached, **self.manifest.to_dict()}


def convert_bundle(
    options: ConvertOptions, *, profile: TargetProfile | None = None, progress: Progress = _stderr
) -> ConvertResult:
    """Build, verify and write the bundle ``options`` describes, for ``profile`` (default: the profile
    ``options.target`` names, else this machine's)."""
    from toolkit.model import targets
    from toolkit.model.platform import host_profile_name

    framework = detect_framework(options.source)
    if profile is None:
        profile = targets.get_profile(options.target or host_profile_name(), targets_dirs=options.targets_dirs)
    policy = policy_for(profile, threads=options.threads)
    name = validate_name(options.name or bundle_name(options.source, policy.name))
    destination = Path(options.out) if options.out else Path("bundles") / name
    if destination.exists() and not options.force:
        raise UsageError(
            f"{destination} already exists.", hint="Pass --force to replace it, or --out / --name for another location."
        )
    for what, path in (("calibration data", options.calibration), ("eval data", options.eval_data),
                       ("labels file", options.labels), ("weights file", options.weights)):
        if path is not None and not Path(path).exists():
            raise UsageError(f"The {what} {str(path)!r} does not exist.", hint="Check the path.")
    plan = plan_recipes(options, policy, framework, has_calibration=options.calibration is not None,
                        as_is=_file_precision(options.source) if framework == Framework.TFLITE else None)

    key = cache.bundle_key(options, policy, name) if options.use_cache else None
    if key is not None:
        cached = cache.cache_root() / key
        if (cached / "manifest.json").is_file():
            progress(f"reusing the cached conversion {key[:12]} (same source, data, options and tool versions)")
            with staging_dir(destination, force=options.force) as staging:
                shutil.copytree(cached, staging, dirs_exist_ok=True)
            return ConvertResult(destination, read_bundle(destination).manifest, cached=True)

    progress(f"loading {options.source} ({framework})")
    source = open_source(options.source, weights=options.weights)
    try:
        with tempfile.TemporaryDirectory(prefix="edgetk-convert-") as scratch, staging_dir(
            destination, force=options.force
        ) as staging:
            run = _start(options, policy, source, plan, Path(scratch), progress)
            kept = _build_all(run, plan)
            if not kept:
                raise _nothing_survived(run.attempts)
            manifest = write_bundle(run, options, name, kept, staging)
        if key is not None:
            cache.store_bundle(destination, cache.cache_root() / key)
    finally:
        source.close()
    progress(f"wrote {destination}")
    return ConvertResult(destination, manifest)


def _file_precision(source: str) -> Precision:
    """A .tflite source's own precision (it ships as it is)."""
    from toolkit.runtimes.inspection.tflite import inspect_tflite

    return Precision(inspect_tflite(Path(source)).precision)


def _start(options: ConvertOptions, policy: Policy, source: SourceModel, plan: Plan, scratch: Path,
           progress: Progress) -> ConvertRun:
    """The run's shared context: data read, the float model's reference outputs computed."""
    data = prepare_data(options, source, progress)
    progress(f"float reference on {len(data.heldout)} held-out samples")
    try:
        reference = verify.run_all(source.predict, data.heldout.feeds)
        recurrent = verify.recurrent_run(source.predict, data.heldout.feeds, source.inputs, source.outputs)
    except ToolkitError:
        raise
    except Exception as exc:
        raise UsageError(
            f"The source model failed on inputs of shape "
            f"{', '.join(f'{k}={v}' for k, v in data.shapes.items())}: {type(exc).__name__}: {str(exc)[:300]}",
            hint="Check --input-shape and the calibration data's layout.",
        ) from None
    return ConvertRun(
        source=source, data=data, reference=reference, policy=policy, scratch=scratch,
        dynamic_batch=options.dynamic_batch, builds=cache.build_dir(options, policy, data), progress=progress,
        task=verify.choose_task(options.task, data.task, verify.declared_outputs(
            options.output_tasks, data.outputs, [s.name for s in source.outputs])),
        metric=verify.load_metric(options.metric) if options.metric else None,
        recurrent=recurrent, attempts=list(plan.skipped),
    )


def _build_all(run: ConvertRun, plan: Plan) -> list[Candidate]:
    """Every planned recipe in order; the first passing non-fp32 artifact of a format ends that format."""
    kept: list[Candidate] = []
    done: set[str] = set()  # formats whose preferred artifact is built
    # formats with a kept INT8 or dynamic artifact: the dynamic and A16W8 fallbacks are for formats without one
    quantized: set[str] = set()
    for item in plan.recipes:
        recipe = item.recipe
        if item.when in (When.DYNAMIC_FALLBACK, When.A16W8_FALLBACK) and recipe.format in quantized | done:
            continue
        if not item.explicit and recipe.precision != Precision.FP32 and recipe.format in done:
            run.attempts.append(Attempt(recipe, AttemptOutcome.DROPPED,
                                        f"skipped: an earlier {recipe.format} recipe was kept"))
            continue
        blocked = _precondition(run, item)
        if blocked is not None:
            run.attempts.append(blocked.attempt(AttemptOutcome.DROPPED))
            continue
        run.progress(f"building {recipe.label}")
        result = build_and_verify(run, recipe, explicit=item.explicit)
        if recipe.precision == Precision.FP32:
            run.caches.fp32.setdefault(recipe.format, result)
        if isinstance(result, Failure):
            run.attempts.append(result.attempt())
            run.progress(f"{recipe.label} failed: {result.reason}")
            retried = runtime_retry(run, result) if not item.explicit and not recipe.a16w8 else None
            if retried is None:
                continue
            result = retried
        if result.failures and (reduced := saturation_retry.retry(run, result)) is not None:
            result = reduced  # this host's x86 kernels saturate where the target's do not: 7-bit weights
        if result.failures and _selective_applies(run, recipe) and not item.explicit:
            run.progress(f"{recipe.label} out of tolerance ({'; '.join(result.failures)}): "
                         "trying selective quantization")
            run.attempts.append(result.attempt(AttemptOutcome.DROPPED, "; ".join(result.problems),
                                               workaround="selective quantization is tried next"))
            mixed = selective(run, result)
            if mixed is None:
                continue
            result = mixed
        if result.failures and not item.explicit:
            run.attempts.append(result.attempt(AttemptOutcome.DROPPED, "; ".join(result.problems), workaround=(
                FP32_OUT_OF_TOLERANCE_WORKAROUND if recipe.precision == Precision.FP32
                else OUT_OF_TOLERANCE_WORKAROUND)))
            run.progress(f"dropped {recipe.label}: {'; '.join(result.problems)}")
            continue
        reason = "asked for" if item.explicit else "passed verification"
        vacuous = result.record.verification.vacuous if result.record.verification else None
        if vacuous:  # status unverified: nothing was proven, so it did not "pass"
            reason = ("asked for; " if item.explicit else "") + f"shipped unverified: {vacuous}"
        if result.problems:
            reason = ("asked for; shipped but marked: " if item.explicit else "shipped, not preferred: ") + "; ".join(
                result.problems
            )
        run.attempts.append(result.attempt(AttemptOutcome.KEPT, reason))
        kept.append(result)
        if result.record.quantized is not None and result.record.quantized.mixed and not item.explicit:
            continue  # mostly float: the format's fallbacks (dynamic, fp16) are still built beside it
        # kept: accurate enough (a slower one is only marked)
        if recipe.precision in (Precision.INT8, Precision.DYNAMIC):
            quantized.add(recipe.format)
        if recipe.precision != Precision.FP32 and not result.problems:
            done.add(recipe.format)  # the preferred artifact of this format: later recipes are not needed
    return kept


def _precondition(run: ConvertRun, item: PlannedRecipe) -> Failure | None:
    """Why ``item`` is not built at all: its format's fp32 failed (nothing trustworthy to compare a quantized
    artifact with), or it is the dynamic fallback and the model is not MatMul/RNN-dominated (a model whose layers all
    sit inside If/Loop/Scan bodies is tried: dynamic is the one quantizer that reaches them)."""
    recipe = item.recipe
    fp32 = run.caches.fp32.get(recipe.format)
    if recipe.precision != Precision.FP32 and fp32 is not None:
        why = fp32.reason if isinstance(fp32, Failure) else "; ".join(fp32.failures)
        if why:
            return failure(recipe, FailureKind.NOT_ATTEMPTED,
                           f"not attempted: the fp32 {recipe.format} artifact failed ({why})",
                           fp32.workaround if isinstance(fp32, Failure) else "fix the fp32 artifact first")
    if item.when is When.DYNAMIC_FALLBACK:
        judge = next((c for c in (fp32, *run.caches.fp32.values()) if isinstance(c, Candidate)), None)
        if judge is None:
            return failure(recipe, FailureKind.NOT_ATTEMPTED,
                           "not attempted: no fp32 artifact to tell whether the model is MatMul/RNN-dominated")
        if not judge.matmul_dominated and not run.backend(judge.recipe.format).nested_layers(judge.built.path):
            return failure(
                recipe, FailureKind.NOT_ATTEMPTED,
                "not attempted: dynamic INT8 is the fallback for MatMul/Gemm/LSTM/GRU-dominated models "
                f"(transformers, recurrent models); this one is convolutional ({_kinds(judge)})",
                "keep the fp16/fp32 fallback, or pass --precision dynamic to build it anyway",
            )
    return None


def _kinds(judge: Candidate) -> str:
    """``by node count: 12 convolutions vs 1 LSTM``, what made the model convolutional. A model whose layers all sit
    inside If/Loop/Scan bodies never gets here: static INT8 cannot reach them, so dynamic is tried whatever the
    count."""
    conv = sum(n for op, n in judge.op_counts.items() if op in CONV_OPS)
    matmul = ", ".join(f"{n} {op}" for op, n in sorted(judge.op_counts.items()) if op in MATMUL_OPS)
    return f"by node count: {conv} convolutions vs {matmul or 'no MatMul/Gemm/LSTM/GRU'}"


def _selective_applies(run: ConvertRun, recipe: Recipe) -> bool:
    """Selective quantization retries static INT8 (not A16W8, itself the last fallback), and dynamic INT8 of a
    model whose layers all sit inside If/Loop/Scan bodies (the one quantizer that reaches them)."""
    if recipe.a16w8 or recipe.precision not in (Precision.INT8, Precision.DYNAMIC):
        return False
    fp32 = run.caches.fp32.get(recipe.format)
    return recipe.precision == Precision.INT8 or (
        isinstance(fp32, Candidate) and bool(run.backend(recipe.format).nested_layers(fp32.built.path)))


def _nothing_survived(attempts: Sequence[Attempt]) -> ConversionError:
    lines = [f"  {a.recipe.brief}: {a.reason}"
             + (f" (workaround: {a.workaround})" if a.workaround else "")
             for a in attempts if a.outcome != AttemptOutcome.KEPT]
    return ConversionError(
        "No artifact survived conversion and verification:\n" + "\n".join(lines or ["  (no recipe was planned)"]),
        hint="Each line says why and what to try; --precision fp32 or another --format may work.",
    )
