"""Target profiles: read ``targets/*.toml`` (shipped, then the user's), validate them, resolve ``extends``.

A profile is what the toolkit knows about one kind of device: its CPU, memory, OS and Python, the runtimes it
can carry (with version bounds), its accelerators, the highest ONNX opset its runtime loads, and an ORDERED
list of :class:`~toolkit.types.Recipe` (the first one that passes verification and is faster than fp32 ships
as the preferred artifact), a latency budget, an accuracy tolerance and a fallback order of precisions.

Where profiles come from, later wins (a user profile with a shipped name replaces it):

1. the shipped folder (:func:`toolkit.resources.targets_dir`),
2. every folder in ``EDGETK_TARGETS_PATH`` (``os.pathsep``-separated),
3. every ``--targets-dir`` folder, in the order given.

``extends = "raspberry-pi-4"`` starts from that profile and deep-merges this file over it (tables merge key by
key; arrays, ``recipes`` among them, are replaced wholesale; ``sources`` are added). A profile that extends its
own name extends the profile it shadows, so a user's ``raspberry-pi-4.toml`` can say
``extends = "raspberry-pi-4"`` and change only the budget.

Every mistake in a file is refused with one :class:`~toolkit.errors.UsageError` that names the file, the key
and the fix. The schema is documented in ``docs/targets.md``.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from toolkit.errors import UsageError
from toolkit.verification.tolerance import Tolerance  # the one Tolerance type (re-exported here)
from toolkit.policy import PlacementExpectation, RegressionPolicy
from toolkit.types import FORMATS, PRECISIONS, RUNTIMES, TFLITE_RUNTIMES, Recipe, RecipeError

ENV_VAR = "EDGETK_TARGETS_PATH"

ARCHES: tuple[str, ...] = ("aarch64", "armv7l", "x86_64")
ACCELERATOR_KINDS: tuple[str, ...] = ("gpu", "edgetpu", "npu", "dsp")

# ONNX Runtime's execution provider names (a misspelt one is only a warning in ORT, then it silently runs on CPU).
EXECUTION_PROVIDERS: tuple[str, ...] = (
    "CPUExecutionProvider",
    "CUDAExecutionProvider",
    "TensorrtExecutionProvider",
    "NvTensorRTRTXExecutionProvider",
    "XnnpackExecutionProvider",
    "ACLExecutionProvider",
    "ArmNNExecutionProvider",
    "DnnlExecutionProvider",
    "OpenVINOExecutionProvider",
    "QNNExecutionProvider",
    "RknpuExecutionProvider",
    "ROCMExecutionProvider",
    "MIGraphXExecutionProvider",
    "CoreMLExecutionProvider",
    "NnapiExecutionProvider",
    "DmlExecutionProvider",
    "VitisAIExecutionProvider",
    "WebGpuExecutionProvider",
)

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")
_PYTHON_RE = re.compile(r"^3\.\d+$")

# ------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class RuntimeRequirement:
    """A runtime the device can carry, with inclusive version bounds.

    ``max_version`` is a prefix bound: ``"2.14"`` admits every 2.14.x. ``None`` means unbounded.
    """

    name: str
    min_version: str | None = None
    max_version: str | None = None
    note: str | None = None

    def admits(self, version: str) -> bool:
        """Whether ``version`` (``"2.14.0"``, ``"1.16.3+cu118"``) lies within the bounds."""
        parsed = parse_version(version)
        if parsed is None:
            return False
        if self.min_version is not None and _cmp(parsed, parse_version(self.min_version) or ()) < 0:
            return False
        if self.max_version is not None:
            upper = parse_version(self.max_version) or ()
            if _cmp(parsed[: len(upper)], upper) > 0:
                return False
        return True

    @property
    def bounds(self) -> str:
        """``>=2.14, <=2.14.*`` style text for tables."""
        parts = []
        if self.min_version:
            parts.append(f">={self.min_version}")
        if self.max_version:
            parts.append(f"<={self.max_version}.*")
        return ", ".join(parts) or "any"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "min_version": self.min_version, "max_version": self.max_version,
                "note": self.note}


@dataclass(frozen=True)
class Accelerator:
    """An accelerator on the device and what a runtime needs to use it (a TFLite delegate, ORT providers)."""

    name: str
    kind: str  # gpu | edgetpu | npu | dsp
    delegate: str | None = None  # TFLite delegate library, e.g. libedgetpu.so.1
    execution_providers: tuple[str, ...] = ()
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
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
    fallback: tuple[str, ...]
    edgetpu: bool = False
    origin: str = "shipped"  # "shipped" or "user"
    path: Path | None = None  # the file this profile came from
    extends: str | None = None
    lineage: tuple[str, ...] = ()  # the files merged, this one first, then its parents
    sources: tuple[str, ...] = ()  # links to the documents the facts come from
    provider_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    regression: RegressionPolicy = RegressionPolicy()  # when a check is a latency regression ([regression])
    placement: tuple[PlacementExpectation, ...] = ()  # where nodes must run ([[placement]])

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

    def to_dict(self) -> dict[str, Any]:
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
            "tolerance": self.tolerance.to_dict(),
            "fallback": list(self.fallback),
            "edgetpu": self.edgetpu,
            "sources": list(self.sources),
        }


# ------------------------------------------------------------------------------------------- versions


def parse_version(text: str) -> tuple[int, ...] | None:
    """The leading numeric part of a version: ``"1.16.3+cu118"`` -> (1, 16, 3); None when there is none."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", text)
    if not match:
        return None
    return tuple(int(p) for p in match.group(1).split("."))


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    pa, pb = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (pa > pb) - (pa < pb)


def runtime_supports(profile: TargetProfile, runtime: str, version: str) -> bool:
    """Whether ``profile`` lists ``runtime`` and ``version`` lies within its bounds."""
    requirement = profile.runtime(runtime)
    return requirement is not None and requirement.admits(version)


# ------------------------------------------------------------------------------------------- schema

# kind: "str", "int", "number", "bool", "str-list", "table", "tables" (array of tables), "table-of-tables"
_TOP: dict[str, str] = {
    "name": "str",
    "description": "str",
    "extends": "str",
    "arch": "str",
    "cpu": "table",
    "memory_mb": "int",
    "os": "str",
    "python": "str",
    "runtimes": "tables",
    "accelerators": "tables",
    "execution_providers": "str-list",
    "provider_options": "table-of-tables",
    "max_onnx_opset": "int",
    "recipes": "tables",
    "threads": "int",
    "latency_budget_ms": "number",
    "tolerance": "table",
    "fallback": "str-list",
    "edgetpu": "bool",
    "sources": "str-list",
}
_REQUIRED_TOP = ("description", "arch", "cpu", "memory_mb", "os", "python", "runtimes", "recipes", "threads",
                 "latency_budget_ms", "tolerance", "fallback")
_SUB: dict[str, dict[str, str]] = {
    "cpu": {"cores": "int", "model": "str"},
    "tolerance": {"max_top1_drop": "number", "min_cosine": "number"},
    "runtimes": {"name": "str", "min_version": "str", "max_version": "str", "note": "str"},
    "accelerators": {"name": "str", "kind": "str", "delegate": "str", "execution_providers": "str-list",
                     "note": "str"},
}
_REQUIRED_SUB: dict[str, tuple[str, ...]] = {
    "cpu": ("cores", "model"),
    "tolerance": ("max_top1_drop", "min_cosine"),
    "runtimes": ("name",),
    "accelerators": ("name", "kind"),
}
_RECIPE_KINDS: dict[str, str] = {
    "format": "str", "precision": "str", "io_dtype": "str", "activation_type": "str", "weight_type": "str",
    "calibration_method": "str", "per_channel": "bool", "quant_format": "str", "threads": "int", "opset": "int",
    "nodes_to_exclude": "str-list", "execution_providers": "str-list", "layout": "str",
}
assert set(_RECIPE_KINDS) == {f.name for f in fields(Recipe)}, "keep _RECIPE_KINDS in step with toolkit.types.Recipe"
_SUB["recipes"] = _RECIPE_KINDS
_REQUIRED_SUB["recipes"] = ("format", "precision")

_KIND_TEXT = {
    "str": "a string", "int": "an integer", "number": "a number", "bool": "true or false",
    "str-list": "an array of strings", "table": "a table", "tables": "an array of tables ([[...]])",
    "table-of-tables": "a table of tables",
}


def _fail(path: Path, key: str, problem: str, fix: str) -> UsageError:
    return UsageError(f"{path}: key '{key}': {problem}", hint=fix)


def _suggest(word: str, choices: Sequence[str]) -> str:
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean '{by_lower[close[0]]}'?)" if close else ""


def _kind_ok(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str-list":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "table":
        return isinstance(value, dict)
    if kind == "tables":
        return isinstance(value, list) and all(isinstance(v, dict) for v in value)
    if kind == "table-of-tables":
        return isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())
    raise AssertionError(kind)


def _check_keys(path: Path, where: str, data: Mapping[str, Any], schema: Mapping[str, str]) -> None:
    """Unknown keys (with a did-you-mean) and wrong types, for one table."""
    for key, value in data.items():
        full = f"{where}{key}"
        if key not in schema:
            raise _fail(path, full, f"unknown key{_suggest(key, list(schema))}.",
                        f"Rename or remove it; the keys a {'profile' if not where else 'table'} takes are: "
                        f"{', '.join(schema)} (docs/targets.md).")
        kind = schema[key]
        if not _kind_ok(value, kind):
            raise _fail(path, full, f"must be {_KIND_TEXT[kind]}, got {_toml_type(value)} ({value!r}).",
                        f"Write {key} as {_KIND_TEXT[kind]} (docs/targets.md).")


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _check_required(path: Path, where: str, data: Mapping[str, Any], required: Sequence[str],
                    context: str = "") -> None:
    for key in required:
        if key not in data:
            raise _fail(path, f"{where}{key}", f"required key is missing{context}.",
                        f"Add {key} = ... (docs/targets.md describes it), or `extends` a profile that has it.")


def _check_choice(path: Path, key: str, value: str, choices: Sequence[str], what: str) -> None:
    if value not in choices:
        raise _fail(path, key, f"unknown {what} {value!r}{_suggest(value, choices)}.",
                    f"Use one of: {', '.join(choices)}.")


def _validate_file(path: Path, data: Mapping[str, Any]) -> None:
    """What can be checked in one file on its own: keys, types, values, each recipe. Required keys and the
    cross-checks wait until ``extends`` has been merged."""
    _check_keys(path, "", data, _TOP)
    for table in ("cpu", "tolerance"):
        if table in data:
            _check_keys(path, f"{table}.", data[table], _SUB[table])
    for array in ("runtimes", "accelerators", "recipes"):
        for index, item in enumerate(data.get(array, ())):
            where = f"{array}[{index}]."
            _check_keys(path, where, item, _SUB[array])
            _check_required(path, where, item, _REQUIRED_SUB[array])
    if "arch" in data:
        _check_choice(path, "arch", data["arch"], ARCHES, "arch")
    for index, runtime in enumerate(data.get("runtimes", ())):
        _check_choice(path, f"runtimes[{index}].name", runtime["name"], RUNTIMES, "runtime")
        for bound in ("min_version", "max_version"):
            if bound in runtime and not _VERSION_RE.match(runtime[bound]):
                raise _fail(path, f"runtimes[{index}].{bound}", f"{runtime[bound]!r} is not a version.",
                            'Write it as numbers and dots, e.g. "2.14" or "1.16.3".')
    names = [r["name"] for r in data.get("runtimes", ())]
    for name in set(names):
        if names.count(name) > 1:
            raise _fail(path, "runtimes", f"runtime {name!r} is listed twice.", "List each runtime once.")
    for index, accel in enumerate(data.get("accelerators", ())):
        _check_choice(path, f"accelerators[{index}].kind", accel["kind"], ACCELERATOR_KINDS, "accelerator kind")
        for ep in accel.get("execution_providers", ()):
            _check_choice(path, f"accelerators[{index}].execution_providers", ep, EXECUTION_PROVIDERS,
                          "execution provider")
    for ep in data.get("execution_providers", ()):
        _check_choice(path, "execution_providers", ep, EXECUTION_PROVIDERS, "execution provider")
    for ep, options in data.get("provider_options", {}).items():
        _check_choice(path, f"provider_options.{ep}", ep, EXECUTION_PROVIDERS, "execution provider")
        for option, value in options.items():
            if not isinstance(value, (str, int, float, bool)):
                raise _fail(path, f"provider_options.{ep}.{option}", "must be a string, number or boolean.",
                            "ONNX Runtime takes provider options as scalars.")
    for precision in data.get("fallback", ()):
        _check_choice(path, "fallback", precision, PRECISIONS, "precision")
    if "python" in data and not _PYTHON_RE.match(data["python"]):
        raise _fail(path, "python", f"{data['python']!r} is not a Python version.", 'Write it as "3.11".')
    for key in ("memory_mb", "threads", "max_onnx_opset"):
        if key in data and data[key] < 1:
            raise _fail(path, key, f"must be at least 1 (got {data[key]}).", "Use a positive integer.")
    if "cpu" in data and data["cpu"].get("cores", 1) < 1:
        raise _fail(path, "cpu.cores", "must be at least 1.", "Use the number of CPU cores.")
    if "latency_budget_ms" in data and data["latency_budget_ms"] <= 0:
        raise _fail(path, "latency_budget_ms", "must be above 0.", "Use the budget in milliseconds.")
    tolerance = data.get("tolerance", {})
    if "max_top1_drop" in tolerance and not 0 <= tolerance["max_top1_drop"] <= 1:
        raise _fail(path, "tolerance.max_top1_drop", f"must be a fraction in [0, 1] (got {tolerance['max_top1_drop']}).",
                    "0.01 means one percentage point of top-1.")
    if "min_cosine" in tolerance and not -1 <= tolerance["min_cosine"] <= 1:
        raise _fail(path, "tolerance.min_cosine", f"must lie in [-1, 1] (got {tolerance['min_cosine']}).",
                    "A cosine similarity such as 0.99.")
    for index, recipe in enumerate(data.get("recipes", ())):
        _build_recipe(path, index, recipe)
    if "name" in data and not _NAME_RE.match(data["name"]):
        raise _fail(path, "name", f"{data['name']!r} is not a valid profile name.",
                    "Use lower case letters, digits, '.', '_' and '-'.")


def _build_recipe(path: Path, index: int, table: Mapping[str, Any]) -> Recipe:
    where = f"recipes[{index}]"
    _check_choice(path, f"{where}.format", table["format"], FORMATS, "format")
    _check_choice(path, f"{where}.precision", table["precision"], PRECISIONS, "precision")
    for ep in table.get("execution_providers", ()):
        _check_choice(path, f"{where}.execution_providers", ep, EXECUTION_PROVIDERS, "execution provider")
    kwargs = dict(table)
    for key in ("nodes_to_exclude", "execution_providers"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    try:
        return Recipe(**kwargs)
    except RecipeError as exc:
        raise _fail(path, f"{where}.{exc.key}", exc.message, exc.hint or "See docs/targets.md.") from exc


# ------------------------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class _Raw:
    name: str
    data: dict[str, Any]
    path: Path
    origin: str


def _read(path: Path, origin: str) -> _Raw:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}.", hint="Fix the syntax (https://toml.io).") from exc
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the profile: {exc.strerror}.") from exc
    _validate_file(path, data)
    name = data.get("name", path.stem)
    if name != path.stem:
        raise _fail(path, "name", f"{name!r} does not match the file name {path.name!r}.",
                    f"Rename the file to {name}.toml or set name = {path.stem!r}.")
    return _Raw(name=name, data=data, path=path, origin=origin)


def _user_dirs(targets_dirs: Sequence[Path]) -> list[tuple[Path, str]]:
    dirs: list[tuple[Path, str]] = []
    for entry in os.environ.get(ENV_VAR, "").split(os.pathsep):
        if entry.strip():
            dirs.append((Path(entry).expanduser(), f"the {ENV_VAR} entry"))
    dirs.extend((Path(d).expanduser(), "--targets-dir") for d in targets_dirs)
    return dirs


def _layers(targets_dirs: Sequence[Path]) -> dict[str, list[_Raw]]:
    """name -> every file defining it, lowest precedence first."""
    layers: dict[str, list[_Raw]] = {}
    from toolkit.resources import targets_dir

    sources: list[tuple[Path, str]] = [(targets_dir(), "shipped")]
    for directory, what in _user_dirs(targets_dirs):
        if not directory.is_dir():
            raise UsageError(f"{what} {directory} is not a directory.",
                             hint="Point it at a folder of <name>.toml target profiles.")
        sources.append((directory, "user"))
    seen: set[Path] = set()
    for directory, origin in sources:
        resolved = directory.resolve()
        if resolved in seen:
            continue
        seen.add(resolved)
        for path in sorted(resolved.glob("*.toml")):
            raw = _read(path, origin if origin == "shipped" else "user")
            layers.setdefault(raw.name, []).append(raw)
    return layers


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if key == "sources":
            merged[key] = list(dict.fromkeys([*base.get("sources", []), *value]))
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = _merge(base[key], value)
        else:
            merged[key] = value
    return merged


def _resolve(name: str, index: int, layers: Mapping[str, list[_Raw]],
             chain: tuple[tuple[str, int], ...]) -> tuple[dict[str, Any], tuple[_Raw, ...]]:
    raw = layers[name][index]
    parent = raw.data.get("extends")
    if parent is None:
        return dict(raw.data), (raw,)
    if parent == name:  # extends the profile this one shadows
        if index == 0:
            raise _fail(raw.path, "extends", f"{name!r} extends itself and shadows no other profile.",
                        "Remove extends, or name a profile that exists.")
        target = (name, index - 1)
    elif parent in layers:
        target = (parent, len(layers[parent]) - 1)
    else:
        raise _fail(raw.path, "extends", f"no profile named {parent!r}{_suggest(parent, list(layers))}.",
                    "Run `edgetk targets list` to see the profiles.")
    if target in chain or target == (name, index):
        cycle = " -> ".join([n for n, _ in chain] + [name, target[0]])
        raise _fail(raw.path, "extends", f"extends forms a cycle ({cycle}).", "Break the cycle: one profile "
                    "in it must not extend another.")
    base, lineage = _resolve(target[0], target[1], layers, chain + ((name, index),))
    data = _merge(base, {k: v for k, v in raw.data.items() if k != "extends"})
    data["name"] = name
    return data, (raw, *lineage)


def _build(data: Mapping[str, Any], lineage: tuple[_Raw, ...]) -> TargetProfile:
    top = lineage[0]
    path = top.path
    context = "" if len(lineage) == 1 else f" (not in the profiles it extends either: {lineage[1].name})"
    _check_required(path, "", data, _REQUIRED_TOP, context)
    for table in ("cpu", "tolerance"):
        _check_required(path, f"{table}.", data[table], _REQUIRED_SUB[table], context)
    if not data["recipes"]:
        raise _fail(path, "recipes", "the profile lists no recipe.", "Add at least one [[recipes]] table.")
    if not data["runtimes"]:
        raise _fail(path, "runtimes", "the profile lists no runtime.", "Add at least one [[runtimes]] table.")
    recipes = tuple(_build_recipe(path, i, r) for i, r in enumerate(data["recipes"]))
    runtimes = tuple(
        RuntimeRequirement(name=r["name"], min_version=r.get("min_version"), max_version=r.get("max_version"),
                           note=r.get("note"))
        for r in data["runtimes"]
    )
    runtime_names = {r.name for r in runtimes}
    max_opset = data.get("max_onnx_opset")
    for index, recipe in enumerate(recipes):
        where = f"recipes[{index}]"
        if recipe.format == "onnx":
            if "onnxruntime" not in runtime_names:
                raise _fail(path, where, "an ONNX recipe, but onnxruntime is not among the runtimes.",
                            "Add a [[runtimes]] table with name = \"onnxruntime\", or drop the recipe.")
            if max_opset is None:
                raise _fail(path, "max_onnx_opset", "required when the profile has an ONNX recipe.",
                            "Set it to the highest opset the device's onnxruntime loads.")
            if recipe.opset is not None and recipe.opset > max_opset:
                raise _fail(path, f"{where}.opset", f"{recipe.opset} is above max_onnx_opset {max_opset}.",
                            f"Use opset {max_opset} or lower.")
        elif not runtime_names & set(TFLITE_RUNTIMES):
            raise _fail(path, where, "a TFLite recipe, but no TFLite runtime is among the runtimes.",
                        f"Add one of {', '.join(TFLITE_RUNTIMES)} to runtimes, or drop the recipe.")
        if recipe.format == "tflite" and recipe.precision == "dynamic" and "tflite-runtime" in runtime_names:
            raise _fail(path, f"{where}.precision",
                        "tflite-runtime (last release 2.14) cannot load dynamic-range models from TF 2.21 "
                        "(FULLY_CONNECTED version 12).",
                        "Use a full int8 recipe for this profile, or remove tflite-runtime from its runtimes.")
    fallback = tuple(data["fallback"])
    if not fallback or fallback[-1] != "fp32" or len(set(fallback)) != len(fallback):
        raise _fail(path, "fallback", f"{list(fallback)} must list each precision once and end with fp32.",
                    'For example: fallback = ["int8", "fp16", "fp32"].')
    edgetpu = bool(data.get("edgetpu", False))
    if edgetpu:
        first = recipes[0]
        if not (first.format == "tflite" and first.precision == "int8" and first.io_dtype in ("uint8", "int8")):
            raise _fail(path, "recipes[0]", f"an Edge TPU profile must prefer full-integer TFLite, got {first.label}.",
                        'Make the first recipe format = "tflite", precision = "int8", io_dtype = "uint8".')
    accelerators = tuple(
        Accelerator(name=a["name"], kind=a["kind"], delegate=a.get("delegate"),
                    execution_providers=tuple(a.get("execution_providers", ())), note=a.get("note"))
        for a in data.get("accelerators", ())
    )
    default_eps = ["CPUExecutionProvider"] if "onnxruntime" in runtime_names else []
    execution_providers = tuple(data.get("execution_providers", default_eps))
    provider_options = {k: dict(v) for k, v in data.get("provider_options", {}).items()}
    for ep in provider_options:
        if ep not in execution_providers:
            raise _fail(path, f"provider_options.{ep}", f"{ep} is not in execution_providers.",
                        f"Add {ep} to execution_providers or remove its options.")
    tolerance = data["tolerance"]
    return TargetProfile(
        name=top.name,
        description=data["description"],
        arch=data["arch"],
        cpu_cores=data["cpu"]["cores"],
        cpu_model=data["cpu"]["model"],
        memory_mb=data["memory_mb"],
        os=data["os"],
        python=data["python"],
        runtimes=runtimes,
        accelerators=accelerators,
        execution_providers=execution_providers,
        max_onnx_opset=max_opset,
        recipes=recipes,
        threads=data["threads"],
        latency_budget_ms=float(data["latency_budget_ms"]),
        tolerance=Tolerance(float(tolerance["max_top1_drop"]), float(tolerance["min_cosine"])),
        fallback=fallback,
        edgetpu=edgetpu,
        origin=top.origin,
        path=top.path,
        extends=top.data.get("extends"),
        lineage=tuple(str(r.path) for r in lineage),
        sources=tuple(data.get("sources", ())),
        provider_options=provider_options,
    )


def load_profiles(*, targets_dirs: Sequence[Path] = ()) -> dict[str, TargetProfile]:
    """Every profile, resolved and validated, by name (sorted): shipped, then ``EDGETK_TARGETS_PATH``, then
    ``targets_dirs``; later wins. Raises UsageError naming the file and key of the first bad profile."""
    layers = _layers(targets_dirs)
    profiles: dict[str, TargetProfile] = {}
    for name in sorted(layers):
        data, lineage = _resolve(name, len(layers[name]) - 1, layers, ())
        profiles[name] = _build(data, lineage)
    return profiles


def get_profile(name: str, *, targets_dirs: Sequence[Path] = ()) -> TargetProfile:
    """One profile by name; an unknown name is a UsageError with a did-you-mean and where to look."""
    profiles = load_profiles(targets_dirs=targets_dirs)
    if name in profiles:
        return profiles[name]
    raise UsageError(f"Unknown target {name!r}{_suggest(name, list(profiles))}.",
                     hint="Run `edgetk targets list` to see the profiles; add your own with --targets-dir DIR.")


# ------------------------------------------------------------------------------------------- matching

# The arch table, ARM core names, board matching and the local probe live in toolkit.platform (one of each);
# re-exported here for the callers that know them as targets.*.
from toolkit.platform import ARM_CPU_PARTS as ARM_CPU_PARTS  # noqa: E402
from toolkit.platform import host_profile_name as host_profile_name  # noqa: E402
from toolkit.platform import match_profile as match_profile  # noqa: E402
from toolkit.platform import normalize_arch as normalize_arch  # noqa: E402
from toolkit.platform import probe_local as probe_local  # noqa: E402
