"""Target profiles: read ``targets/*.toml`` (shipped, then the user's), validate them, resolve ``extends``.

A profile is what the toolkit knows about one kind of device (CPU, memory, runtimes, accelerators, opset), an
ORDERED list of :class:`~toolkit.model.recipe.Recipe`, a latency budget, a tolerance and a fallback order.
Where profiles come from (later wins), how ``extends`` merges and the schema: docs/targets.md. Every mistake in
a file is refused with one :class:`~toolkit.errors.UsageError` that names the file, the key and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.errors import UsageError
from toolkit.model.policy import CheckPolicy, PlacementExpectation, RegressionPolicy
from toolkit.model.profile_files import DOCS, ProfileSource, build_recipe, read_layers, read_policies, refusal, resolve
from toolkit.model.records import JsonDict, JsonObject
from toolkit.model.schemas.problems import did_you_mean
from toolkit.model.tolerance import Tolerance  # the one Tolerance type
from toolkit.model.recipe import Recipe
from toolkit.model.vocabulary import TFLITE_RUNTIMES, AcceleratorKind, Format, IoDtype, Precision, Runtime

if TYPE_CHECKING:  # pragma: no cover - pydantic loads only when a file is read
    from toolkit.model.schemas.targets import ProfileFile


@dataclass(frozen=True)
class RuntimeRequirement:
    """A runtime the device can carry, with inclusive version bounds.

    ``max_version`` is a prefix bound: ``"2.14"`` admits every 2.14.x. ``None`` means unbounded.
    """

    name: str
    min_version: str | None = None
    max_version: str | None = None
    note: str | None = None

    @property
    def specifier(self) -> str:
        """The bounds as a PEP 440 specifier: ``>=2.14, <2.15`` (the prefix bound 2.14 admits every 2.14.x)."""
        parts = []
        if self.min_version:
            parts.append(f">={self.min_version}")
        if self.max_version:
            parts.append(f"<{_next_prefix(self.max_version)}")
        return ", ".join(parts)

    def admits(self, version: str) -> bool:
        """Whether ``version`` (``"2.14.0"``, ``"1.16.3+cu118"``) lies within the bounds. Compared as PEP 440
        versions (``packaging``): a pre-release such as ``2.14.0rc1`` comes before ``2.14`` and is admitted
        by no bound of releases; text that is no version is admitted by nothing."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        try:
            parsed = Version(version.strip())
        except InvalidVersion:
            return False
        return SpecifierSet(self.specifier).contains(parsed)

    @property
    def bounds(self) -> str:
        """``>=2.14, <2.15`` style text for tables."""
        return self.specifier or "any"

    def to_dict(self) -> JsonDict:
        return {"name": self.name, "min_version": self.min_version, "max_version": self.max_version,
                "note": self.note}


@dataclass(frozen=True)
class Accelerator:
    """An accelerator on the device and what a runtime needs to use it (a TFLite delegate, ORT providers)."""

    name: str
    kind: AcceleratorKind
    delegate: str | None = None  # TFLite delegate library, e.g. libedgetpu.so.1
    execution_providers: tuple[str, ...] = ()
    note: str | None = None

    def to_dict(self) -> JsonDict:
        return {"name": self.name, "kind": self.kind, "delegate": self.delegate,
                "execution_providers": list(self.execution_providers), "note": self.note}


@dataclass(frozen=True)
class TargetProfile:
    """One resolved, validated profile (``extends`` already applied)."""

    name: str
    description: str
    arch: str
    cpu_cores: int
    cpu_model: str
    memory_mb: int
    os: str
    python: str
    runtimes: tuple[RuntimeRequirement, ...]
    accelerators: tuple[Accelerator, ...]
    execution_providers: tuple[str, ...]
    max_onnx_opset: int | None
    recipes: tuple[Recipe, ...]
    threads: int
    latency_budget_ms: float
    tolerance: Tolerance
    fallback: tuple[Precision, ...]
    edgetpu: bool = False
    origin: str = "shipped"  # "shipped" or "user"
    path: Path | None = None  # the file this profile came from
    extends: str | None = None
    lineage: tuple[str, ...] = ()  # the files merged, this one first, then its parents
    sources: tuple[str, ...] = ()  # links to the documents the facts come from
    provider_options: Mapping[str, JsonObject] = field(default_factory=dict, hash=False)
    regression: RegressionPolicy = RegressionPolicy()  # when a check is a latency regression ([regression])
    placement: tuple[PlacementExpectation, ...] = ()  # where nodes must run ([[placement]])
    min_throughput_ips: float | None = None  # the throughput floor check --throughput gates on

    @property
    def preferred_recipe(self) -> Recipe:
        """The first recipe: what the profile would ship if it passes verification."""
        return self.recipes[0]

    @property
    def runtime_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.runtimes)

    def runtime(self, name: str) -> RuntimeRequirement | None:
        for requirement in self.runtimes:
            if requirement.name == name:
                return requirement
        return None

    def to_dict(self) -> JsonDict:
        return {
            "name": self.name,
            "description": self.description,
            "origin": self.origin,
            "path": str(self.path) if self.path else None,
            "extends": self.extends,
            "lineage": list(self.lineage),
            "arch": self.arch,
            "cpu": {"cores": self.cpu_cores, "model": self.cpu_model},
            "memory_mb": self.memory_mb,
            "os": self.os,
            "python": self.python,
            "runtimes": [r.to_dict() for r in self.runtimes],
            "accelerators": [a.to_dict() for a in self.accelerators],
            "execution_providers": list(self.execution_providers),
            "provider_options": {k: dict(v) for k, v in self.provider_options.items()},
            "max_onnx_opset": self.max_onnx_opset,
            "recipes": [dict(r.to_dict(), label=r.label) for r in self.recipes],
            "threads": self.threads,
            "latency_budget_ms": self.latency_budget_ms,
            "min_throughput_ips": self.min_throughput_ips,
            "tolerance": self.tolerance.to_dict(),
            "fallback": list(self.fallback),
            "edgetpu": self.edgetpu,
            "sources": list(self.sources),
        }


def check_policy_from_profile(profile: TargetProfile) -> CheckPolicy:
    """The policy a bundle converted for ``profile`` is checked by."""
    tolerance = profile.tolerance
    return CheckPolicy(
        target=profile.name,
        latency_budget_ms=float(profile.latency_budget_ms),
        regression=profile.regression,
        placement=tuple(profile.placement),
        tolerance={"max_top1_drop": float(tolerance.max_top1_drop), "min_cosine": float(tolerance.min_cosine)},
        min_throughput_ips=profile.min_throughput_ips,
    )


def parse_version(text: str) -> tuple[int, ...] | None:
    """The release numbers of a PEP 440 version: ``"1.16.3+cu118"`` -> (1, 16, 3); None when it is none."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text.strip()).release
    except InvalidVersion:
        return None


def _next_prefix(bound: str) -> str:
    """The first version past the prefix bound: ``"2.14"`` -> ``"2.15"`` (so ``<2.15`` admits every 2.14.x)."""
    release = parse_version(bound) or (0,)
    return ".".join(map(str, (*release[:-1], release[-1] + 1)))


def runtime_supports(profile: TargetProfile, runtime: str, version: str) -> bool:
    """Whether ``profile`` lists ``runtime`` and ``version`` lies within its bounds."""
    requirement = profile.runtime(runtime)
    return requirement is not None and requirement.admits(version)


# The schema (keys, types, vocabularies, bounds) is a pydantic model in toolkit.model.schemas.targets; reading
# the files and merging ``extends`` is toolkit.model.profile_files. What stays here are the checks across keys,
# made once ``extends`` has been merged.


def _check_recipe_runtimes(path: Path, recipes: Sequence[Recipe], runtime_names: set[str],
                           max_opset: int | None) -> None:
    """Each recipe needs a runtime of the profile that loads its format (and an ONNX one an opset bound)."""
    for index, recipe in enumerate(recipes):
        where = f"recipes[{index}]"
        if recipe.format == Format.ONNX:
            if Runtime.ONNXRUNTIME not in runtime_names:
                raise refusal(path, where, "an ONNX recipe, but onnxruntime is not among the runtimes.",
                              "Add a [[runtimes]] table with name = \"onnxruntime\", or drop the recipe.")
            if max_opset is None:
                raise refusal(path, "max_onnx_opset", "required when the profile has an ONNX recipe.",
                              "Set it to the highest opset the device's onnxruntime loads.")
            if recipe.opset is not None and recipe.opset > max_opset:
                raise refusal(path, f"{where}.opset", f"{recipe.opset} is above max_onnx_opset {max_opset}.",
                              f"Use opset {max_opset} or lower.")
        elif recipe.format == Format.PTE:
            if Runtime.EXECUTORCH not in runtime_names:
                raise refusal(path, where, "an ExecuTorch (.pte) recipe, but executorch is not among the "
                              "runtimes.", "Add a [[runtimes]] table with name = \"executorch\", or drop the recipe.")
        elif not runtime_names & set(TFLITE_RUNTIMES):
            raise refusal(path, where, "a TFLite recipe, but no TFLite runtime is among the runtimes.",
                          f"Add one of {', '.join(TFLITE_RUNTIMES)} to runtimes, or drop the recipe.")
        if (recipe.format == Format.TFLITE and recipe.precision == Precision.DYNAMIC
                and Runtime.TFLITE_RUNTIME in runtime_names):
            raise refusal(path, f"{where}.precision",
                          "tflite-runtime (last release 2.14) cannot load dynamic-range models from TF 2.21 "
                          "(FULLY_CONNECTED version 12).",
                          "Use a full int8 recipe for this profile, or remove tflite-runtime from its runtimes.")


def _check_order(path: Path, recipes: Sequence[Recipe], fallback: Sequence[str], edgetpu: bool) -> None:
    """The fallback ends with fp32; an Edge TPU profile prefers full-integer TFLite."""
    if not fallback or fallback[-1] != Precision.FP32 or len(set(fallback)) != len(fallback):
        raise refusal(path, "fallback", f"{list(fallback)} must list each precision once and end with fp32.",
                      'For example: fallback = ["int8", "fp16", "fp32"].')
    first = recipes[0]
    if edgetpu and not (first.format == Format.TFLITE and first.precision == Precision.INT8
                        and first.io_dtype in (IoDtype.UINT8, IoDtype.INT8)):
        raise refusal(path, "recipes[0]", f"an Edge TPU profile must prefer full-integer TFLite, got {first.label}.",
                      'Make the first recipe format = "tflite", precision = "int8", io_dtype = "uint8".')


def _providers(path: Path, profile: ProfileFile,
               runtime_names: set[str]) -> tuple[tuple[str, ...], dict[str, JsonDict]]:
    """The execution providers (CPU by default where onnxruntime is listed) and their options."""
    default = ["CPUExecutionProvider"] if Runtime.ONNXRUNTIME in runtime_names else []
    providers = tuple(profile.execution_providers if profile.execution_providers is not None else default)
    options = {k: dict(v) for k, v in profile.provider_options.items()}
    for ep in options:
        if ep not in providers:
            raise refusal(path, f"provider_options.{ep}", f"{ep} is not in execution_providers.",
                          f"Add {ep} to execution_providers or remove its options.")
    return providers, options


def _policies(path: Path, profile: ProfileFile) -> tuple[RegressionPolicy, tuple[PlacementExpectation, ...]]:
    """``[regression]`` and ``[[placement]]`` of the merged profile as the check policy's records."""
    return read_policies(path, profile.regression, profile.placement)


def _validated(data: JsonObject, lineage: tuple[ProfileSource, ...]) -> ProfileFile:
    """The merged data through the schema, with every required key; a profile needs a recipe and a runtime."""
    from toolkit.model.schemas import validate
    from toolkit.model.schemas.targets import ProfileFile

    path = lineage[0].path
    context = "" if len(lineage) == 1 else f" (not in the profiles it extends either: {lineage[1].name})"
    profile = validate(ProfileFile, data, file=path, docs=DOCS, missing_context=context)
    assert profile is not None  # not partial: a problem raises
    if not profile.recipes:
        raise refusal(path, "recipes", "the profile lists no recipe.", "Add at least one [[recipes]] table.")
    if not profile.runtimes:
        raise refusal(path, "runtimes", "the profile lists no runtime.", "Add at least one [[runtimes]] table.")
    return profile


def _build(data: JsonObject, lineage: tuple[ProfileSource, ...]) -> TargetProfile:
    top = lineage[0]
    path = top.path
    profile = _validated(data, lineage)
    recipes = tuple(build_recipe(path, i, r) for i, r in enumerate(profile.recipes))
    runtimes = tuple(RuntimeRequirement(name=r.name, min_version=r.min_version, max_version=r.max_version,
                                        note=r.note) for r in profile.runtimes)
    runtime_names = {r.name for r in runtimes}
    _check_recipe_runtimes(path, recipes, runtime_names, profile.max_onnx_opset)
    _check_order(path, recipes, profile.fallback, profile.edgetpu)
    execution_providers, provider_options = _providers(path, profile, runtime_names)
    regression, placement = _policies(path, profile)
    return TargetProfile(
        name=top.name,
        description=profile.description,
        arch=profile.arch,
        cpu_cores=profile.cpu.cores,
        cpu_model=profile.cpu.model,
        memory_mb=profile.memory_mb,
        os=profile.os,
        python=profile.python,
        runtimes=runtimes,
        accelerators=tuple(Accelerator(name=a.name, kind=AcceleratorKind(a.kind), delegate=a.delegate, note=a.note,
                                       execution_providers=tuple(a.execution_providers))
                           for a in profile.accelerators),
        execution_providers=execution_providers,
        max_onnx_opset=profile.max_onnx_opset,
        recipes=recipes,
        threads=profile.threads,
        latency_budget_ms=float(profile.latency_budget_ms),
        tolerance=Tolerance.from_dict(profile.tolerance.model_dump(exclude_none=True)),
        fallback=tuple(Precision(p) for p in profile.fallback),
        edgetpu=profile.edgetpu,
        origin=top.origin,
        path=top.path,
        extends=top.data.get("extends"),
        lineage=tuple(str(r.path) for r in lineage),
        sources=tuple(profile.sources),
        provider_options=provider_options,
        regression=regression,
        placement=placement,
        min_throughput_ips=float(profile.min_throughput_ips) if profile.min_throughput_ips is not None else None,
    )


def load_profiles(*, targets_dirs: Sequence[Path] = ()) -> dict[str, TargetProfile]:
    """Every profile, resolved and validated, by name (sorted): shipped, then ``EDGETK_TARGETS_PATH``, then
    ``targets_dirs``; later wins. Raises UsageError naming the file and key of the first bad profile."""
    layers = read_layers(targets_dirs)
    profiles: dict[str, TargetProfile] = {}
    for name in sorted(layers):
        data, lineage = resolve(name, len(layers[name]) - 1, layers)
        profiles[name] = _build(data, lineage)
    return profiles


def get_profile(name: str, *, targets_dirs: Sequence[Path] = ()) -> TargetProfile:
    """One profile by name; an unknown name is a UsageError with a did-you-mean and where to look."""
    profiles = load_profiles(targets_dirs=targets_dirs)
    if name in profiles:
        return profiles[name]
    raise UsageError(f"Unknown target {name!r}{did_you_mean(name, list(profiles))}.",
                     hint="Run `edgetk targets list` to see the profiles; add your own with --targets-dir DIR.")
