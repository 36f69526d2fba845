"""The convert stage: source + data + target profile -> a verified bundle directory.

For every recipe (the profile's, in its order of preference, or the precisions/formats the user asked for)
the stage builds the artifact through the real converter, proves that it really is what its label says
(quantized operators counted), runs it in its real runtime on held-out inputs against the float model, times
it against the fp32 artifact of the same format, and keeps or drops it with the reason written down. An INT8
recipe that breaks the tolerance is retried with its worst layers kept in float before the stage falls back
to the next recipe. What the user asked for explicitly is never silently changed: it ships, marked.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolkit import calibration as cal
from toolkit import verify
from toolkit.__about__ import __version__
from toolkit.bundle import (
    GOLDEN_INPUTS,
    GOLDEN_REFERENCE,
    golden_outputs_name,
    install_runner,
    read_bundle,
    save_npz,
    sha256_file,
    staging_dir,
    write_manifest,
)
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.errors import ConversionError, ToolkitError, UsageError
from toolkit.options import ConvertOptions  # the one definition (the CLI and the API share it)
from toolkit.quiet import native_stderr_silenced
from toolkit.sources import SourceModel, detect_framework, open_source
from toolkit.types import (
    FORMATS,
    ArtifactRecord,
    Attempt,
    CalibrationRef,
    Golden,
    Manifest,
    Recipe,
    SourceRef,
    TensorSpec,
    artifact_file_name,
)

Progress = Callable[[str], None]
GOLDEN_SAMPLES = 8
MAX_VERIFY_SAMPLES = 500
SLOWER_FACTOR = 1.10  # an artifact more than 10% slower than fp32 (and 0.02 ms) counts as slower
SELECTIVE_STEPS = (1, 3)  # how many of the best float groups (a culprit layer, maybe with its consumers) to try
INCOMPATIBLE = "the target's runtime cannot load it:"
EDGETPU_COMPILER = "edgetpu_compiler"
EDGETPU_LOG = "edgetpu_compiler.log"
EDGETPU_INSTALL = (
    "curl https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo apt-key add - && "
    'echo "deb https://packages.cloud.google.com/apt coral-edgetpu-stable main" | '
    "sudo tee /etc/apt/sources.list.d/coral-edgetpu.list && "
    "sudo apt-get update && sudo apt-get install edgetpu-compiler"
)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ConvertResult:
    bundle_dir: Path
    manifest: Manifest
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The document ``edgetk convert --json`` prints: the bundle's path, whether it came from the cache,
        and the manifest's keys."""
        return {"bundle": str(self.bundle_dir), "cached": self.cached, **self.manifest.to_dict()}


@dataclass(frozen=True)
class _Policy:
    """What the target profile says (or the defaults without one)."""

    name: str | None
    arch: str | None
    recipes: tuple[Recipe, ...]
    tolerance: verify.Tolerance
    threads: int
    max_opset: int | None
    preferences: Mapping[str, Any]
    fallback: tuple[str, ...] = ()  # precisions to fall back along, ending in fp32
    tflite_bounds: tuple[tuple[str, str | None], ...] = ()  # (runtime, max_version) of the TFLite runtimes
    edgetpu: bool = False
    delegate: str | None = None  # the Edge TPU delegate library, for the compiled artifact's record
    provider_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------- planning


def bundle_name(source: str, target: str | None) -> str:
    """``digits-raspberry-pi-4``: the source's stem and the target, lower case, in ``[a-z0-9._-]``."""
    stem = source.split(":")[-1] if detect_is_factory(source) else Path(source.rstrip("/")).stem
    raw = f"{stem}-{target}" if target else stem
    name = re.sub(r"[^a-z0-9._-]+", "-", raw.lower()).strip("-.") or "model"
    return name[:100]


def detect_is_factory(source: str) -> bool:
    return ":" in source and not Path(source).exists()


def validate_name(name: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,99}", name) or ".." in name:
        raise UsageError(
            f"The bundle name {name!r} is not allowed.",
            hint="Use 1-100 characters from a-z, 0-9, '.', '_' and '-', starting with a letter or digit.",
        )
    return name


def _policy(options: ConvertOptions) -> _Policy:
    try:
        from toolkit import targets
    except ImportError:  # pragma: no cover - profiles ship with the package
        targets = None  # type: ignore[assignment]
    if targets is None:
        return _Policy(options.target, None, (), verify.Tolerance(), options.threads or 2, None, {})
    name = options.target or targets.host_profile_name()
    profile = targets.get_profile(name, targets_dirs=options.targets_dirs)
    tol = getattr(profile, "tolerance", None)
    tolerance = verify.Tolerance(
        max_top1_drop=float(getattr(tol, "max_top1_drop", 0.01)),
        min_cosine=float(getattr(tol, "min_cosine", 0.99)),
    )
    preferences = {
        "runtimes": [getattr(r, "name", str(r)) for r in getattr(profile, "runtimes", ())],
        "execution_providers": list(getattr(profile, "execution_providers", ()) or ()),
        "threads": getattr(profile, "threads", None),
        "latency_budget_ms": getattr(profile, "latency_budget_ms", None),
    }
    return _Policy(
        name=profile.name,
        arch=getattr(profile, "arch", None),
        recipes=tuple(profile.recipes),
        tolerance=tolerance,
        threads=options.threads or min(getattr(profile, "threads", None) or 2, os.cpu_count() or 2),
        max_opset=getattr(profile, "max_onnx_opset", None),
        preferences=preferences,
        fallback=tuple(profile.fallback),
        tflite_bounds=tuple(
            (r.name, r.max_version) for r in profile.runtimes if r.name in targets.TFLITE_RUNTIMES
        ),
        edgetpu=profile.edgetpu,
        delegate=next((a.delegate for a in profile.accelerators if a.kind == "edgetpu" and a.delegate), None),
        provider_options={k: dict(v) for k, v in profile.provider_options.items()},
    )


def _default_formats(framework: str) -> tuple[str, ...]:
    if framework == "tflite":
        return ("tflite",)
    if framework == "onnx":
        return ("onnx",)
    if framework in ("keras", "savedmodel"):
        return ("tflite", "onnx")
    return ("onnx",)


def _plain_recipe(fmt: str, precision: str, options: ConvertOptions, profile_recipes: Sequence[Recipe]) -> Recipe:
    """The profile's recipe for (format, precision) if it has one, else the toolkit's defaults."""
    base = next((r for r in profile_recipes if r.format == fmt and r.precision == precision), None)
    if base is None:
        io = "int8" if (fmt == "tflite" and precision == "int8") else "float32"
        base = Recipe(format=fmt, precision=precision, io_dtype=io)
    return _apply_overrides(base, options)


def _apply_overrides(recipe: Recipe, options: ConvertOptions) -> Recipe:
    changes: dict[str, Any] = {}
    if options.io_dtype and recipe.format == "tflite" and recipe.precision == "int8":
        changes["io_dtype"] = options.io_dtype
    if options.calibration_method and recipe.precision == "int8":
        changes["calibration_method"] = options.calibration_method
    if options.threads:
        changes["threads"] = options.threads
    return dataclasses.replace(recipe, **changes) if changes else recipe


def plan_recipes(
    options: ConvertOptions, policy: _Policy, framework: str, has_calibration: bool
) -> tuple[list[tuple[Recipe, bool]], list[Attempt]]:
    """The recipes to build, each flagged explicit (asked for by the user) or not, and the ones skipped."""
    from toolkit.conversion.registry import check_supported

    skipped: list[Attempt] = []
    explicit = bool(options.precisions)
    formats = tuple(dict.fromkeys(options.formats)) or ()
    for fmt in formats:
        check_supported(framework, fmt)  # the user asked for it: refuse plainly
    if explicit:
        fmts = formats or _default_formats(framework)
        planned = [
            (_plain_recipe(fmt, p, options, policy.recipes), True)
            for fmt in fmts
            for p in dict.fromkeys(options.precisions)
        ]
        missing_cal = [r for r, _ in planned if r.precision == "int8" and not has_calibration]
        if missing_cal:
            raise UsageError(
                "INT8 needs calibration data.",
                hint="Pass --calibration PATH (.npy, .npz or an image folder with dataset.toml).",
            )
    else:
        candidates = [_apply_overrides(r, options) for r in policy.recipes] or [
            Recipe(format=fmt, precision=p, io_dtype="int8" if (fmt, p) == ("tflite", "int8") else "float32")
            for fmt in _default_formats(framework)
            for p in ("int8", "fp32")
        ]
        planned = []
        for recipe in candidates:
            if formats and recipe.format not in formats:
                continue
            try:
                check_supported(framework, recipe.format)
            except UsageError as exc:
                skipped.append(Attempt(recipe.to_dict(), "failed", f"skipped: {exc.message}"))
                continue
            if recipe.precision == "int8" and not has_calibration:
                skipped.append(Attempt(recipe.to_dict(), "failed", "skipped: INT8 needs --calibration data"))
                continue
            planned.append((recipe, False))
        planned.extend(_fallback_recipes(planned, policy, options, has_calibration, skipped))
        for fmt in formats or tuple(dict.fromkeys(r.format for r, _ in planned)) or _default_formats(framework):
            if not any(r.format == fmt and r.precision == "fp32" for r, _ in planned):
                try:
                    check_supported(framework, fmt)
                except UsageError:
                    continue
                planned.append((_plain_recipe(fmt, "fp32", options, ()), False))
    # fp32 of each format first: it is the baseline every other artifact is timed against.
    planned.sort(key=lambda item: (FORMATS.index(item[0].format), item[0].precision != "fp32"))
    if framework == "tflite":
        return [(r, e) for r, e in planned if r.format == "tflite"][:1] or planned[:1], skipped
    return planned, skipped


def _fallback_recipes(
    planned: Sequence[tuple[Recipe, bool]],
    policy: _Policy,
    options: ConvertOptions,
    has_calibration: bool,
    skipped: list[Attempt],
) -> list[tuple[Recipe, bool]]:
    """The profile's ``fallback`` precisions each format does not list a recipe for, after its own recipes.

    ``fallback = ["int8", "fp16", "fp32"]`` with only an int8 and an fp32 recipe: when int8 (and its mixed
    int8/float retry) loses, fp16 is tried before fp32. They are built only when every earlier recipe of the
    format was dropped (the stage stops at the first one kept). fp32 is planned for every format anyway.
    """
    extra: list[tuple[Recipe, bool]] = []
    for fmt in dict.fromkeys(r.format for r, _ in planned):
        have = {r.precision for r, _ in planned if r.format == fmt}
        for precision in policy.fallback:
            if precision in have or precision == "fp32":
                continue
            recipe = _plain_recipe(fmt, precision, options, ())
            recipe = dataclasses.replace(recipe, execution_providers=next(
                (r.execution_providers for r, _ in planned if r.format == fmt and r.execution_providers), ()))
            if precision == "int8" and not has_calibration:
                skipped.append(Attempt(recipe.to_dict(), "failed", "skipped (fallback): INT8 needs --calibration data"))
                continue
            extra.append((recipe, False))
    return extra


# --------------------------------------------------------------------------------------------- cache


def _tool_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {"edge-toolkit": __version__}
    for dist in ("tensorflow", "keras", "tf2onnx", "onnx", "onnxruntime", "onnxconverter-common", "ai-edge-litert",
                 "torch", "litert-torch", "numpy"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _source_hash(source: str) -> str:
    path = Path(source.rsplit(":", 1)[0] if detect_is_factory(source) else source)
    return cal.hash_path(path) if path.exists() else hashlib.sha256(source.encode()).hexdigest()


def cache_root() -> Path:
    root = os.environ.get("EDGETK_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgetk" / "convert"


def _cache_key(options: ConvertOptions, policy: _Policy, name: str) -> str:
    material = {
        "source": _source_hash(options.source),
        "weights": cal.hash_path(options.weights) if options.weights and options.weights.exists() else None,
        "calibration": cal.hash_path(options.calibration) if options.calibration and options.calibration.exists() else None,
        "eval": cal.hash_path(options.eval_data) if options.eval_data and options.eval_data.exists() else None,
        "labels": cal.hash_path(options.labels) if options.labels and options.labels.exists() else None,
        "options": {k: v for k, v in options.to_config().items() if k not in ("out", "force", "use_cache", "source")},
        "recipes": [r.to_dict() for r in policy.recipes],
        "tolerance": dataclasses.asdict(policy.tolerance),
        "target": policy.name,
        "name": name,
        "versions": _tool_versions(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:32]


# --------------------------------------------------------------------------------------------- the stage


def convert_bundle(options: ConvertOptions, *, progress: Progress = _stderr) -> ConvertResult:
    """Build, verify and write the bundle ``options`` describes."""
    framework = detect_framework(options.source)
    policy = _policy(options)
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
    recipes, skipped = plan_recipes(options, policy, framework, has_calibration=options.calibration is not None)

    key = _cache_key(options, policy, name) if options.use_cache else None
    if key is not None:
        cached = cache_root() / key
        if (cached / "manifest.json").is_file():
            progress(f"reusing the cached conversion {key[:12]} (same source, data, options and tool versions)")
            with staging_dir(destination, force=options.force) as staging:
                shutil.copytree(cached, staging, dirs_exist_ok=True)
            bundle = read_bundle(destination)
            return ConvertResult(destination, bundle.manifest, cached=True)

    progress(f"loading {options.source} ({framework})")
    source = open_source(options.source, weights=options.weights)
    try:
        with tempfile.TemporaryDirectory(prefix="edgetk-convert-") as scratch, staging_dir(
            destination, force=options.force
        ) as staging:
            manifest = _convert(options, policy, name, source, recipes, skipped, Path(scratch), staging, progress)
        if key is not None:
            _store_cache(destination, cache_root() / key)
    finally:
        source.close()
    progress(f"wrote {destination}")
    return ConvertResult(destination, manifest)


def _store_cache(bundle_dir: Path, target: Path) -> None:
    try:
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(bundle_dir, tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    except OSError:
        pass  # the cache is an optimisation; a read-only cache dir must not fail a conversion


@dataclass
class _Data:
    calibration: cal.SampleSet
    heldout: cal.SampleSet
    synthetic: bool
    shapes: dict[str, tuple[int, ...]]
    calibration_ref: CalibrationRef | None
    preprocessing: Any
    builds: Path | None = None  # where built artifacts are reused from (ConvertOptions.workdir), keyed


def _prepare_data(options: ConvertOptions, source: SourceModel, progress: Progress) -> _Data:
    inputs = source.inputs
    cal_file = cal.read_data(options.calibration, inputs) if options.calibration else None
    eval_file = cal.read_data(options.eval_data, inputs, what="eval data") if options.eval_data else None
    unknown_rank = () if getattr(source, "input_shapes_known", True) else [
        s.name for s in inputs if s.shape == (None,)
    ]
    shapes = cal.resolve_shapes(
        inputs, overrides=options.input_shapes, data=cal_file or eval_file, unknown_rank=unknown_rank
    )
    calibration = cal.SampleSet(())
    heldout: cal.SampleSet | None = None
    if cal_file is not None:
        samples = cal.to_samples(cal_file, inputs, shapes)
        if eval_file is None:
            calibration, heldout = cal.split_heldout(samples)
        else:
            calibration = samples
        calibration = cal.subset(calibration, options.calibration_samples)
        cal.warn_if_few(calibration)
    if eval_file is not None:
        heldout = cal.to_samples(eval_file, inputs, shapes, what="eval data")
    synthetic = heldout is None
    if heldout is None:
        heldout = cal.synthetic_samples(inputs, shapes)
        progress("no data given: verifying on random inputs (pass --calibration or --eval-data for real ones)")
    if len(heldout) > MAX_VERIFY_SAMPLES:
        heldout = cal.subset(heldout, MAX_VERIFY_SAMPLES)
    return _Data(
        calibration=calibration,
        heldout=heldout,
        synthetic=synthetic,
        shapes=shapes,
        calibration_ref=CalibrationRef(str(options.calibration), cal_file.sha256, len(calibration))
        if cal_file is not None
        else None,
        preprocessing=(cal_file.preprocessing if cal_file else None) or (eval_file.preprocessing if eval_file else None),
    )


@dataclass
class _Built:
    recipe: Recipe
    explicit: bool
    built: BuiltArtifact
    record: ArtifactRecord
    outputs: list[list[np.ndarray]]
    failures: list[str]  # accuracy: beyond the tolerance
    slower: str | None = None  # speed: slower than fp32 in the same runtime

    @property
    def problems(self) -> list[str]:
        return self.failures + ([self.slower] if self.slower else [])


def _convert(
    options: ConvertOptions,
    policy: _Policy,
    name: str,
    source: SourceModel,
    recipes: list[tuple[Recipe, bool]],
    skipped: list[Attempt],
    scratch: Path,
    staging: Path,
    progress: Progress,
) -> Manifest:
    data = _prepare_data(options, source, progress)
    progress(f"float reference on {len(data.heldout)} held-out samples")
    try:
        reference = verify.run_all(source.predict, data.heldout.feeds)
    except ToolkitError:
        raise
    except Exception as exc:
        raise UsageError(
            f"The source model failed on inputs of shape "
            f"{', '.join(f'{k}={v}' for k, v in data.shapes.items())}: {type(exc).__name__}: {str(exc)[:300]}",
            hint="Check --input-shape and the calibration data's layout.",
        ) from None
    attempts: list[Attempt] = list(skipped)
    kept: list[_Built] = []
    fp32_latency: dict[str, float] = {}
    done_formats: set[str] = set()

    data.builds = _build_cache_dir(options, policy, data)

    def request_for(recipe: Recipe) -> ConversionRequest:
        # one float ONNX export per opset: recipes of one profile may ask for different opsets
        workdir = scratch / f"opset-{recipe.opset or 'default'}"
        workdir.mkdir(exist_ok=True)
        return ConversionRequest(
            source=source,
            recipe=recipe,
            input_shapes=data.shapes,
            calibration=data.calibration.feeds,
            workdir=workdir,
            max_opset=policy.max_opset,
            dynamic_batch=options.dynamic_batch,
        )

    for recipe, explicit in recipes:
        if not explicit and recipe.precision != "fp32" and recipe.format in done_formats:
            attempts.append(Attempt(recipe.to_dict(), "dropped", f"skipped: an earlier {recipe.format} recipe was kept"))
            continue
        progress(f"building {recipe.label}")
        result = _attempt(request_for(recipe), explicit, source, data, reference, policy, fp32_latency, scratch)
        if isinstance(result, Attempt):
            attempts.append(result)
            if explicit:
                raise ConversionError(f"{recipe.label}: {result.reason}", hint=_hint_for(recipe, result.reason))
            continue
        if result.failures and recipe.precision == "int8" and not explicit:
            progress(f"{recipe.label} out of tolerance ({'; '.join(result.failures)}): trying selective quantization")
            attempts.append(_attempt_record(result, "dropped", "; ".join(result.problems)))
            mixed = _selective(result, request_for, source, data, reference, policy, fp32_latency, scratch, attempts,
                               progress)
            if mixed is None:
                continue
            result = mixed
        if result.failures and not explicit:
            attempts.append(_attempt_record(result, "dropped", "; ".join(result.problems)))
            progress(f"dropped {recipe.label}: {'; '.join(result.problems)}")
            continue
        reason = "asked for" if explicit else "passed verification"
        if result.problems:
            reason = ("asked for; shipped but marked: " if explicit else "shipped, not preferred: ") + "; ".join(
                result.problems
            )
        attempts.append(_attempt_record(result, "kept", reason))
        kept.append(result)
        if recipe.precision != "fp32" and not result.problems:
            done_formats.add(recipe.format)  # the preferred artifact of this format: later recipes are not needed
    if not kept:
        raise ConversionError(
            "No artifact survived conversion and verification.",
            hint="See the reasons above; try --precision fp32 or another --format.",
        )
    return _write(options, policy, name, source, data, reference, kept, attempts, staging)


def _runtime_incompatibilities(path: Path, policy: _Policy) -> str:
    """Why a bounded TFLite runtime of the profile (tflite-runtime 2.14) cannot load ``path``; "" if it can."""
    from toolkit.compat import tflite_incompatibilities

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


def _build_cache_dir(options: ConvertOptions, policy: _Policy, data: _Data) -> Path | None:
    """``options.workdir``/<everything a built file depends on but the recipe>: None without a workdir."""
    if options.workdir is None:
        return None
    material = {
        "source": _source_hash(options.source),
        "weights": cal.hash_path(options.weights) if options.weights and options.weights.exists() else None,
        "calibration": data.calibration_ref.sha256 if data.calibration_ref else None,
        "calibration_samples": len(data.calibration),
        "shapes": {k: list(v) for k, v in data.shapes.items()},
        "dynamic_batch": options.dynamic_batch,
        "max_opset": policy.max_opset,
        "versions": _tool_versions(),
    }
    key = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return Path(options.workdir) / key


def _recipe_key(recipe: Recipe) -> str:
    return hashlib.sha256(json.dumps(recipe.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _reuse_build(builds: Path | None, recipe: Recipe, output: Path) -> BuiltArtifact | None:
    """The artifact an earlier run built for this recipe (same source, data, options, tools), copied to
    ``output``; None when there is none."""
    if builds is None:
        return None
    folder = builds / _recipe_key(recipe)
    try:
        meta = json.loads((folder / "built.json").read_text())
        shutil.copyfile(folder / "artifact", output)
    except (OSError, ValueError):
        return None
    return BuiltArtifact(
        path=output,
        float_nodes=tuple(meta.get("float_nodes", ())),
        notes=tuple(meta.get("notes", ())),
        exporter=meta.get("exporter"),
        layout=meta.get("layout"),
    )


def _keep_build(builds: Path | None, recipe: Recipe, built: BuiltArtifact) -> None:
    if builds is None:
        return
    folder = builds / _recipe_key(recipe)
    try:
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        shutil.copyfile(built.path, tmp / "artifact")
        meta = {"float_nodes": list(built.float_nodes), "notes": list(built.notes), "exporter": built.exporter,
                "layout": built.layout, "recipe": recipe.to_dict()}
        (tmp / "built.json").write_text(json.dumps(meta))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    except OSError:
        pass  # reuse is an optimisation; a read-only workdir must not fail a conversion


def _hint_for(recipe: Recipe, reason: str = "") -> str:
    if reason.startswith(INCOMPATIBLE):
        return ("The target's runtime cannot load this artifact; ask for another --precision (full int8 loads "
                "everywhere), or pick a --target whose runtimes are newer.")
    if recipe.precision == "int8":
        return "Check the calibration data, try another --calibration-method, or use --precision fp16/fp32."
    return "Run with --debug for the converter's full output."


def _attempt_record(built: _Built, outcome: str, reason: str) -> Attempt:
    metrics = {
        "verification": built.record.verification.to_dict() if built.record.verification else None,
        "host_latency_ms": built.record.host_latency_ms,
        "fp32_latency_ms": built.record.fp32_latency_ms,
        "bytes": built.record.bytes,
        "float_nodes": list(built.record.float_nodes),
    }
    return Attempt(built.recipe.to_dict(), outcome, reason, file=built.record.file, metrics=metrics)


def _attempt(
    request: ConversionRequest,
    explicit: bool,
    source: SourceModel,
    data: _Data,
    reference: list[list[np.ndarray]],
    policy: _Policy,
    fp32_latency: dict[str, float],
    scratch: Path,
) -> _Built | Attempt:
    from toolkit.conversion import registry
    from toolkit.execution import open_session
    from toolkit.inspection import inspect_model

    recipe = request.recipe
    ext = recipe.format
    output = scratch / f"candidate-{hashlib.sha256(json.dumps(recipe.to_dict(), sort_keys=True).encode()).hexdigest()[:10]}.{ext}"
    try:
        if source.framework == "tflite":
            shutil.copyfile(source.path, output)
            built = BuiltArtifact(path=output, notes=("taken as it is (no conversion)",))
        else:
            reused = _reuse_build(data.builds, recipe, output)
            if reused is not None:
                built = reused
            else:
                with native_stderr_silenced():
                    built = registry.build(request, output)
                _keep_build(data.builds, recipe, built)
    except UsageError:
        raise
    except ToolkitError as exc:
        return Attempt(recipe.to_dict(), "failed", exc.message)
    info = inspect_model(built.path)
    if recipe.format == "tflite":
        incompatible = _runtime_incompatibilities(built.path, policy)
        if incompatible:
            return Attempt(recipe.to_dict(), "failed", f"{INCOMPATIBLE} {incompatible}")
    if source.framework == "tflite":
        recipe = dataclasses.replace(recipe, precision=info.precision)
    if recipe.precision in ("int8", "dynamic") and info.quantized_ops == 0:
        return Attempt(
            recipe.to_dict(), "failed", "quantization changed nothing: the artifact holds no quantized operators"
        )
    session = open_session(built.path, threads=recipe.threads or policy.threads)
    in_order = align(source.inputs, session.inputs, what="input")
    out_order = align(source.outputs, session.outputs, what="output")

    def run(feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        native = session.run({session.inputs[j].name: feed[spec.name] for spec, j in zip(source.inputs, in_order)})
        return [native[j] for j in out_order]

    try:
        outputs = verify.run_all(run, data.heldout.feeds)
        verification = verify.compare(reference, outputs, labels=data.heldout.labels)
        latency = verify.median_latency_ms(run, data.heldout.feeds[0])
        runtime = session.runtime
    except ToolkitError:
        raise
    except Exception as exc:
        return Attempt(recipe.to_dict(), "failed", f"the artifact does not run in its runtime: {exc}")
    finally:
        session.close()
    failures = verify.tolerance_failures(verification, policy.tolerance)
    status = "out_of_tolerance" if failures else "ok"
    if recipe.precision == "fp32":
        fp32_latency.setdefault(recipe.format, latency)
    base = fp32_latency.get(recipe.format)
    slower = None
    device_only = list(_device_only_providers(recipe))
    if policy.edgetpu and recipe.format == "tflite" and recipe.precision == "int8":
        device_only.append("the Edge TPU (once compiled by edgetpu_compiler)")
    notes: tuple[str, ...] = ()
    if device_only:
        # The device runs it on an accelerator this host lacks: CPU timings say nothing about that speed.
        notes = (f"timed on this host's CPU only; the device runs it on {', '.join(device_only)} "
                 "(not available here), so it is not compared with fp32",)
        status = status if status != "ok" else "no_speedup_measured"
    elif base is not None and recipe.precision != "fp32" and latency > base * SLOWER_FACTOR and latency - base > 0.02:
        slower = f"slower than fp32 in {runtime} ({latency:.3f} ms vs {base:.3f} ms)"
        status = status if status != "ok" else "slower"
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
        runtime=runtime,
        status=status,
        recipe=recipe.to_dict(),
        float_nodes=built.float_nodes,
        execution_providers=recipe.execution_providers,
        provider_options={ep: dict(policy.provider_options[ep]) for ep in recipe.execution_providers
                          if ep in policy.provider_options},
        layout=built.layout,
        notes=notes + tuple(built.notes)
        + ((f"exported with {built.exporter}",) if built.exporter else ())
        + (("verified on random inputs: no data was given",) if data.synthetic else ()),
    )
    return _Built(recipe, explicit, built, record, outputs, failures, slower)


def align(source: Sequence[TensorSpec], artifact: Sequence[TensorSpec], *, what: str) -> list[int]:
    """For each source tensor, the index of the artifact tensor that carries it.

    Converters rename tensors (``image`` -> ``serving_default_image:0``) and may reorder them; match by exact
    name, then by a name that contains the source name, then by position among the rest.
    """
    if len(source) != len(artifact):
        raise ConversionError(
            f"The artifact has {len(artifact)} {what}s but the source model has {len(source)}.",
            hint="Report this model: the converter changed its signature.",
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


def _selective(
    failed: _Built,
    request_for: Callable[[Recipe], ConversionRequest],
    source: SourceModel,
    data: _Data,
    reference: list[list[np.ndarray]],
    policy: _Policy,
    fp32_latency: dict[str, float],
    scratch: Path,
    attempts: list[Attempt],
    progress: Progress,
) -> _Built | None:
    """Keep the layers that hurt most in float and try again; None when that does not help either.

    ``_worst_nodes`` orders groups of layers by what keeping them in float does to the outputs; the best
    group is tried, then the union of the best ``SELECTIVE_STEPS[-1]``. A result that passes keeps the label
    int8 with the float layers in ``float_nodes``, and is preferred over the fp16/fp32 fallback.
    """
    recipe = failed.recipe
    try:
        with native_stderr_silenced():
            ranked = _worst_nodes(request_for(recipe), failed.built)
    except ToolkitError as exc:
        attempts.append(Attempt(recipe.to_dict(), "failed", f"selective quantization unavailable: {exc.message}"))
        return None
    if not ranked:
        return None
    tried: set[tuple[str, ...]] = set()
    for count in SELECTIVE_STEPS:
        # the union of the first ``count`` groups that each add a node (a group inside a better one adds none)
        union: list[str] = []
        added = 0
        for group, _ in ranked:
            if added < count and any(node not in union for node in group):
                union.extend(node for node in group if node not in union)
                added += 1
        nodes = tuple(union)
        if nodes in tried:
            break
        tried.add(nodes)
        mixed = dataclasses.replace(recipe, nodes_to_exclude=tuple(dict.fromkeys(recipe.nodes_to_exclude + nodes)))
        progress(f"retrying {recipe.label} with {len(mixed.nodes_to_exclude)} layer(s) in float")
        result = _attempt(request_for(mixed), False, source, data, reference, policy, fp32_latency, scratch)
        if isinstance(result, Attempt):
            attempts.append(result)
            continue
        if not result.failures:
            return result
        attempts.append(_attempt_record(result, "dropped", "; ".join(result.problems)))
    return None


def _worst_nodes(request: ConversionRequest, int8: BuiltArtifact) -> list[tuple[tuple[str, ...], float]]:
    """Groups of layers to keep in float, best first, with the output error each leaves (sensitivity)."""
    limit = 2 * max(SELECTIVE_STEPS)  # groups inside a better one add nothing to the union: rank a few more
    if request.recipe.format == "tflite":
        from toolkit.conversion import tflite

        return tflite.float_groups(request, limit=limit)
    from toolkit.conversion import onnx_quant, registry

    base = registry.fp32_onnx(request)
    return onnx_quant.float_groups(request, base, int8, limit=limit)


def _write(
    options: ConvertOptions,
    policy: _Policy,
    name: str,
    source: SourceModel,
    data: _Data,
    reference: list[list[np.ndarray]],
    kept: list[_Built],
    attempts: list[Attempt],
    staging: Path,
) -> Manifest:
    golden_count = min(GOLDEN_SAMPLES, len(data.heldout))
    golden_feeds = data.heldout.feeds[:golden_count]
    save_npz(
        staging / GOLDEN_INPUTS,
        {f"input_{i}": np.stack([feed[spec.name] for feed in golden_feeds]) for i, spec in enumerate(source.inputs)},
    )
    save_npz(staging / GOLDEN_REFERENCE, _stack_outputs(reference[:golden_count]))
    records: list[ArtifactRecord] = []
    used: set[str] = set()
    preferred = _preferred(kept, options)
    for item in kept:
        record = item.record
        if record.file in used:  # two recipes of one precision and format: keep the first (preferred)
            continue
        used.add(record.file)
        shutil.copyfile(item.built.path, staging / record.file)
        golden_name = golden_outputs_name(record.file)
        outputs = item.outputs[:golden_count]
        save_npz(staging / golden_name, _stack_outputs(outputs))
        record = dataclasses.replace(record, golden=Golden(golden_name, _golden_atol(record, outputs)),
                                     preferred=any(item is p for p in preferred))
        records.append(record)
    if policy.edgetpu:
        records.extend(_edgetpu(records, policy, attempts, staging))
    labels = _read_labels(options.labels) if options.labels else None
    runner = install_runner(staging)
    manifest = Manifest(
        name=name,
        created_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        toolkit_version=__version__,
        source=SourceRef(path=options.source, sha256=_source_hash(options.source), framework=source.framework),
        target=policy.name,
        target_arch=policy.arch,
        artifacts=tuple(records),
        golden_inputs=GOLDEN_INPUTS,
        preprocessing=data.preprocessing,
        labels=labels,
        calibration=data.calibration_ref,
        runner=runner,
        attempts=tuple(attempts),
        runtime_preferences=policy.preferences,
        config=options.to_config(),
    )
    write_manifest(staging, manifest)
    return manifest


def _preferred(kept: Sequence[_Built], options: ConvertOptions) -> list[_Built]:
    """Per format, the artifact the device should run: the first, in order of preference, whose accuracy is
    within the tolerance and that is not slower than fp32. Order: the user's ``--precision`` order when they
    asked; else the profile's recipe (the stage keeps at most one non-fp32 per format) before fp32."""
    chosen: dict[str, _Built] = {}

    def rank(item: _Built) -> int:
        if item.explicit and item.recipe.precision in options.precisions:
            return options.precisions.index(item.recipe.precision)
        return 1 if item.recipe.precision == "fp32" else 0

    for item in sorted(kept, key=rank):
        if not item.problems and item.recipe.format not in chosen:
            chosen[item.recipe.format] = item
    return list(chosen.values())


def _edgetpu(
    records: Sequence[ArtifactRecord], policy: _Policy, attempts: list[Attempt], staging: Path
) -> list[ArtifactRecord]:
    """Compile the full-int8 artifact for the Edge TPU with ``edgetpu_compiler`` when it is on PATH.

    Without the compiler the bundle still ships (the CPU int8 artifact runs anywhere) and an attempt says
    exactly what to install and run. The compiled model cannot be verified here: it needs an Edge TPU.
    """
    import subprocess

    int8 = next((r for r in records if r.format == "tflite" and r.precision == "int8"
                 and str(r.recipe.get("io_dtype")) in ("uint8", "int8")), None)
    recipe = dict(int8.recipe) if int8 else {"format": "tflite", "precision": "int8", "io_dtype": "uint8"}
    if int8 is None:
        attempts.append(Attempt(recipe, "failed", "not compiled for the Edge TPU: no full-integer TFLite artifact "
                                "passed verification (the Edge TPU runs only those)"))
        return []
    stem = Path(int8.file).stem  # model.int8
    compiled_name = f"{stem}_edgetpu.tflite"
    command = f"{EDGETPU_COMPILER} --show_operations --out_dir . {int8.file}"
    compiler = shutil.which(EDGETPU_COMPILER)
    if compiler is None:
        attempts.append(Attempt(
            recipe, "failed",
            f"not compiled for the Edge TPU: {EDGETPU_COMPILER} is not on PATH (it runs only on x86-64 "
            f"Debian/Ubuntu). Install it: {EDGETPU_INSTALL}; then, in the bundle folder, run: {command} "
            f"(writes {compiled_name}; {int8.file} runs on the CPU meanwhile)",
            file=int8.file,
        ))
        return []
    out_dir = staging / ".edgetpu"
    out_dir.mkdir()
    try:
        proc = subprocess.run(
            [compiler, "--show_operations", "--out_dir", str(out_dir), str(staging / int8.file)],
            capture_output=True, text=True, timeout=600, check=False,
        )
        log = (proc.stdout or "") + (proc.stderr or "")
        (staging / EDGETPU_LOG).write_text(log)
        produced = out_dir / compiled_name
        if proc.returncode != 0 or not produced.is_file():
            tail = " ".join(log.strip().splitlines()[-3:])[:400]
            attempts.append(Attempt(recipe, "failed", f"{EDGETPU_COMPILER} failed (exit {proc.returncode}): {tail}; "
                                    f"see {EDGETPU_LOG}", file=int8.file))
            return []
        shutil.move(str(produced), staging / compiled_name)
    except (OSError, subprocess.TimeoutExpired) as exc:
        attempts.append(Attempt(recipe, "failed", f"{EDGETPU_COMPILER} could not run: {exc}", file=int8.file))
        return []
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    # the real compiler prints "Edge TPU Compiler version 16.0.384591198"
    version = next((line.strip() for line in log.splitlines()
                    if line.lower().startswith("edge tpu compiler version")), "version unknown")
    path = staging / compiled_name
    record = dataclasses.replace(
        int8,
        file=compiled_name,
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
        verification=None,
        golden=None,
        host_latency_ms=None,
        fp32_latency_ms=None,
        runtime=None,
        status="no_speedup_measured",
        preferred=False,
        delegate=policy.delegate or "libedgetpu.so.1",
        notes=(f"compiled from {int8.file} by {EDGETPU_COMPILER} ({version}); log: {EDGETPU_LOG}",
               "runs only with the Edge TPU delegate; not verified on this host (no Edge TPU here): "
               f"{int8.file} is the verified CPU artifact"),
    )
    attempts.append(Attempt(recipe, "kept", f"compiled for the Edge TPU by {EDGETPU_COMPILER}", file=compiled_name))
    return [record]


def _stack_outputs(per_sample: Sequence[Sequence[np.ndarray]]) -> dict[str, np.ndarray]:
    if not per_sample:
        return {}
    return {
        f"output_{i}": np.stack([np.asarray(outs[i], dtype=np.float32) for outs in per_sample])
        for i in range(len(per_sample[0]))
    }


def _golden_atol(record: ArtifactRecord, outputs: Sequence[Sequence[np.ndarray]]) -> float:
    """How far a device may drift from this host's outputs: kernels differ across CPUs (ARM vs x86,
    XNNPACK vs reference), by rounding for float and by a quantization step or two for integer models."""
    magnitude = max((float(np.max(np.abs(o))) for outs in outputs for o in outs if np.size(o)), default=1.0)
    relative = {"fp32": 1e-4, "fp16": 1e-2, "dynamic": 5e-2, "int8": 5e-2}[record.precision]
    atol = relative * max(1.0, magnitude)
    for spec in record.outputs:
        if spec.quantization and spec.quantization.scale:
            atol = max(atol, 2.0 * max(spec.quantization.scale))
    return float(atol)


def _read_labels(path: Path) -> tuple[str, ...]:
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Cannot read the labels file {path}: {exc}.", hint="One class name a line, UTF-8.") from None
    labels = tuple(line for line in lines if line)
    if not labels:
        raise UsageError(f"The labels file {path} is empty.", hint="One class name a line.")
    return labels

