"""Target profiles: read ``targets/*.toml`` (shipped, then the user's), validate them, resolve ``extends``.

A profile is what the toolkit knows about one kind of device (CPU, memory, runtimes, accelerators, opset), an
ORDERED list of :class:`~toolkit.model.recipe.Recipe`, a latency budget, a tolerance and a fallback order.
Where profiles come from (later wins), how ``extends`` merges and the schema: docs/targets.md. Every mistake in
a file is refused with one :class:`~toolkit.errors.UsageError` that names the file, the key and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from toolkit.errors import UsageError
from toolkit.model.platform import ACCELERATOR_KINDS, ARCHES
from toolkit.model.policy import CheckPolicy, GateLimits
from toolkit.model.profile_files import ProfileSource, duplicate_runtimes, read_layers, refusal, resolve
from toolkit.model.reading import NOT_READ, RecordProblem, Words, check_record, read_file
from toolkit.model.records import JsonDict, JsonObject, Record
from toolkit.model.schemas.problems import did_you_mean
from toolkit.model.schemas.targets import (
    DOCS,
    Cpu,
    Match,
    OptionValue,
    PositiveInt,
    PrecisionWord,
    ProfileName,
    Provider,
    PythonVersion,
    Version,
    nonempty,
)
from toolkit.model.tolerance import Tolerance  # the one Tolerance type
from toolkit.model.recipe import Recipe
from toolkit.model.vocabulary import RUNTIMES, TFLITE_RUNTIMES, AcceleratorKind, Format, IoDtype, Precision, Runtime


@dataclass(frozen=True)
class RuntimeRequirement(Record):
    """A runtime the device can carry, with inclusive version bounds.

    ``max_version`` is a prefix bound: ``"2.14"`` admits every 2.14.x. ``None`` means unbounded.
    """

    name: Annotated[str, Words(RUNTIMES, "runtime")]
    min_version: Version | None = None
    max_version: Version | None = None
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


@dataclass(frozen=True)
class Accelerator(Record):
    """An accelerator on the device and what a runtime needs to use it (a TFLite delegate, ORT providers)."""

    name: str
    kind: Annotated[AcceleratorKind, Words(ACCELERATOR_KINDS, "accelerator kind")]
    delegate: str | None = None  # TFLite delegate library, e.g. libedgetpu.so.1
    execution_providers: tuple[Provider, ...] = ()
    note: str | None = None


@dataclass(frozen=True, kw_only=True)
class TargetProfile(GateLimits):
    """One resolved, validated profile (``extends`` already applied). Its fields are the profile file's keys,
    written once: the engine reads a file into it (:mod:`toolkit.model.reading`, with the rules in the hints),
    ``to_dict`` writes it (``targets show --json``), and the gate limits it inherits from
    :class:`~toolkit.model.policy.GateLimits` (``latency_budget_ms``, ``[regression]``, ``[[placement]]``,
    ``min_throughput_ips``) become the check policy (:func:`check_policy_from_profile`). Fields marked
    ``NOT_READ`` say where the profile came from; no file writes them.
    """

    name: ProfileName
    description: str
    origin: Annotated[str, NOT_READ] = "shipped"  # "shipped" or "user"
    path: Annotated[Path | None, NOT_READ] = None  # the file this profile came from
    extends: str | None = None
    lineage: Annotated[tuple[str, ...], NOT_READ] = ()  # the files merged, this one first, then its parents
    arch: Annotated[str, Words(ARCHES, "arch")]
    cpu: Cpu
    memory_mb: PositiveInt
    os: str
    python: PythonVersion
    runtimes: Annotated[tuple[RuntimeRequirement, ...], nonempty("runtime", "Add at least one [[runtimes]] table.")]
    accelerators: tuple[Accelerator, ...] = ()
    # None in a file: CPUExecutionProvider where onnxruntime is listed (resolved when the profile is built)
    execution_providers: tuple[Provider, ...] | None = None
    provider_options: Mapping[Provider, Mapping[str, OptionValue]] = field(default_factory=dict, hash=False)
    max_onnx_opset: PositiveInt | None = None
    recipes: Annotated[tuple[Recipe, ...], nonempty("recipe", "Add at least one [[recipes]] table.")]
    threads: PositiveInt
    tolerance: Tolerance
    fallback: tuple[PrecisionWord, ...]
    edgetpu: bool = False
    sources: tuple[str, ...] = ()  # links to the documents the facts come from
    match: Match | None = None  # what picks this profile for a probed device (toolkit.model.platform)

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
        """Every field (as :class:`~toolkit.model.records.Record` writes it), each recipe with its label."""
        data = {"name": self.name, **super().to_dict()}
        data["recipes"] = [dict(r.to_dict(), label=r.label) for r in self.recipes]
        return data


def check_policy_from_profile(profile: TargetProfile) -> CheckPolicy:
    """The policy a bundle converted for ``profile`` is checked by: every gate limit of the profile (the fields
    of :class:`~toolkit.model.policy.GateLimits`, copied whatever they are), its name and the tolerance it was
    verified against."""
    tolerance = {"max_top1_drop": float(profile.tolerance.max_top1_drop),
                 "min_cosine": float(profile.tolerance.min_cosine)}
    limits = {f.name: getattr(profile, f.name) for f in dataclasses.fields(GateLimits)}
    return dataclasses.replace(CheckPolicy(target=profile.name, tolerance=tolerance), **limits)


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


# The schema (keys, types, vocabularies, bounds) is TargetProfile itself, read by toolkit.model.reading; reading
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


def _providers(path: Path, profile: TargetProfile) -> tuple[tuple[str, ...], dict[str, Mapping[str, object]]]:
    """The execution providers (CPU by default where onnxruntime is listed) and their options."""
    default = ("CPUExecutionProvider",) if Runtime.ONNXRUNTIME in profile.runtime_names else ()
    providers = profile.execution_providers if profile.execution_providers is not None else default
    options = dict(profile.provider_options)
    for ep in options:
        if ep not in providers:
            raise refusal(path, f"provider_options.{ep}", f"{ep} is not in execution_providers.",
                          f"Add {ep} to execution_providers or remove its options.")
    return providers, options


def _build(data: Mapping[str, object], lineage: tuple[ProfileSource, ...]) -> TargetProfile:
    """The merged data read into a TargetProfile (every required key now), checked across keys."""
    top = lineage[0]
    path = top.path
    context = "" if len(lineage) == 1 else f" (not in the profiles it extends either: {lineage[1].name})"
    merged = {**{k: v for k, v in data.items() if k != "extends"}, "name": top.name}
    if top.data.get("extends") is not None:
        merged["extends"] = top.data["extends"]
    profile = read_file(TargetProfile, merged, file=path, docs=DOCS, missing_context=context)
    runtime_names = set(profile.runtime_names)
    _check_recipe_runtimes(path, profile.recipes, runtime_names, profile.max_onnx_opset)
    _check_order(path, profile.recipes, profile.fallback, profile.edgetpu)
    execution_providers, provider_options = _providers(path, profile)
    return dataclasses.replace(profile, origin=top.origin, path=path, lineage=tuple(str(r.path) for r in lineage),
                               execution_providers=execution_providers, provider_options=provider_options)


def _check_file(path: Path, data: JsonObject) -> None:
    """What can be checked in one file on its own: keys, types, values, each recipe and policy table (the
    engine reads the file as far as it goes). Required keys and the cross-checks wait until ``extends`` has been
    merged."""
    try:
        check_record(TargetProfile, data, docs=DOCS)
    except RecordProblem as exc:
        raise exc.problem.error(path) from None
    duplicate_runtimes(path, data)


def load_profiles(*, targets_dirs: Sequence[Path] = ()) -> dict[str, TargetProfile]:
    """Every profile, resolved and validated, by name (sorted): shipped, then ``EDGETK_TARGETS_PATH``, then
    ``targets_dirs``; later wins. Raises UsageError naming the file and key of the first bad profile."""
    layers = read_layers(targets_dirs, check=_check_file)
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
