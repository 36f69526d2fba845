"""Planning a conversion: the options and the profile's policy (``policy``) -> the recipes to build, in order,
with what will not be built and why (``Plan.skipped``), before any slow work starts. What a format settles or
refuses before building (its default I/O type, reduce_range, a profile's too-old runtime) its backend says.

* ``plan_recipes``: ``--precision``/``--format`` (explicit: built as asked) or the profile's recipes (with its
  ``fallback`` precisions), fp32 of each format first (every other artifact of it is timed against it).
* A profile that lists INT8 also gets a conditional *dynamic* INT8 recipe per format (``DYNAMIC_FALLBACK``),
  built only when static INT8 failed or lost *and* MatMul/Gemm/LSTM/GRU dominate; on a Conv network it is
  skipped (ONNX Runtime runs ConvInteger up to 6x slower than fp32 on x86, findings.md 2).
* A16W8 recipes (``A16W8_FALLBACK``) are built only when no 8-bit INT8 artifact of the format was kept: they buy
  accuracy and 4x smaller weights, not speed (slower than fp32 on CPUs, docs/targets.md), so they are never
  preferred to a passing 8-bit INT8, and ``--precision int8`` builds the profile's 8-bit recipe.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.errors import UsageError
from toolkit.conversion.backend import backend_for
from toolkit.conversion.policy import Policy
from toolkit.conversion.routes import check_supported, default_formats, supports, supports_precision
from toolkit.model.artifact import Attempt
from toolkit.model.recipe import Recipe
from toolkit.model.vocabulary import (
    FORMATS,
    AttemptOutcome,
    Format,
    Framework,
    IoDtype,
    Precision,
)

if TYPE_CHECKING:
    from toolkit.model.options import ConvertOptions


class When(StrEnum):
    ALWAYS = "always"
    DYNAMIC_FALLBACK = "dynamic_fallback"  # static INT8 of the format lost, and MatMul/Gemm/RNN dominate
    A16W8_FALLBACK = "a16w8_fallback"  # no 8-bit INT8 artifact of the format was kept


@dataclass(frozen=True)
class PlannedRecipe:
    recipe: Recipe
    explicit: bool  # asked for by the user (--precision): built as asked, never dropped silently
    when: When = When.ALWAYS


@dataclass(frozen=True)
class Plan:
    recipes: tuple[PlannedRecipe, ...]
    skipped: tuple[Attempt, ...] = ()


# --------------------------------------------------------------------------------------------- names


def detect_is_factory(source: str) -> bool:
    return ":" in source and not Path(source).exists()


def bundle_name(source: str, target: str | None) -> str:
    """``digits-raspberry-pi-4``: the source's stem and the target, lower case, in ``[a-z0-9._-]``.

    A PyTorch factory ``nets/digits.py:make_model`` (or ``pkg.digits:make_model``) gives ``digits.make_model``:
    its file and its function, so two projects' ``make_model`` factories do not overwrite each other's bundle.
    """
    if detect_is_factory(source):
        where, _, function = source.rpartition(":")
        module = Path(where).stem if where.endswith(".py") else where.rsplit(".", 1)[-1]
        stem = ".".join(part for part in (module, function) if part)
    else:
        stem = Path(source.rstrip("/")).stem
    raw = f"{stem}-{target}" if target else stem
    name = re.sub(r"[^a-z0-9._-]+", "-", raw.lower()).strip("-.") or "model"
    return name[:100]


def validate_name(name: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,99}", name) or ".." in name:
        raise UsageError(
            f"The bundle name {name!r} is not allowed.",
            hint="Use 1-100 characters from a-z, 0-9, '.', '_' and '-', starting with a letter or digit.",
        )
    return name


# --------------------------------------------------------------------------------------------- recipes


def _default_recipe(framework: str, fmt: Format, precision: Precision) -> Recipe:
    """The toolkit's recipe for (format, precision): the route's backend says its I/O type."""
    return Recipe(fmt, precision, io_dtype=backend_for(framework, fmt).default_io(precision))


def _plain_recipe(framework: str, fmt: Format, precision: Precision, options: ConvertOptions,
                  profile_recipes: Sequence[Recipe]) -> Recipe:
    """The profile's recipe for (format, precision) if it has one, else the toolkit's defaults."""
    base = next((r for r in profile_recipes if r.format == fmt and r.precision == precision and not r.a16w8), None)
    if base is None:
        base = _default_recipe(framework, fmt, precision)
    return _apply_overrides(framework, base, options)


def _integer_io(framework: str, recipe: Recipe) -> bool:
    """Whether ``recipe``'s format takes integer I/O at its precision (a pair without a route: no)."""
    if supports(framework, recipe.format) is not None:
        return False
    return backend_for(framework, recipe.format).default_io(recipe.precision) != IoDtype.FLOAT32


def _apply_overrides(framework: str, recipe: Recipe, options: ConvertOptions) -> Recipe:
    """``recipe`` with the user's overrides: ``--io-dtype`` where the format's I/O is integer (its backend's
    default for the precision: full INT8 TFLite), ``--calibration-method`` on INT8, ``--threads``."""
    changes: dict[str, Any] = {}  # Any: keyword values of dataclasses.replace, each field its own type
    if options.io_dtype and not recipe.a16w8 and _integer_io(framework, recipe):
        changes["io_dtype"] = options.io_dtype
    if options.calibration_method and recipe.precision == Precision.INT8:
        changes["calibration_method"] = options.calibration_method
    if options.threads:
        changes["threads"] = options.threads
    return dataclasses.replace(recipe, **changes) if changes else recipe


def _skip(recipe: Recipe, reason: str) -> Attempt:
    return Attempt(recipe, AttemptOutcome.FAILED, f"skipped: {reason}")


def plan_recipes(options: ConvertOptions, policy: Policy, framework: str, *, has_calibration: bool,
                 as_is: Precision | None = None) -> Plan:
    """The recipes to build, in order, and the ones skipped before any work (with the reason). ``as_is``: a .tflite
    source's own precision (its one TFLite artifact is planned, logged and named at it)."""
    skipped: list[Attempt] = []
    formats = tuple(dict.fromkeys(options.formats))
    for fmt in formats:
        check_supported(framework, fmt)  # the user asked for it: refuse plainly
    planned: list[PlannedRecipe]
    if options.precisions:
        planned = [
            PlannedRecipe(_plain_recipe(framework, fmt, p, options, policy.recipes), True)
            for fmt in formats or default_formats(framework)
            for p in dict.fromkeys(options.precisions)
        ]
        if not has_calibration and any(p.recipe.precision == Precision.INT8 for p in planned):
            raise UsageError(
                "INT8 needs calibration data.",
                hint="Pass --calibration PATH (.npy, .npz or an image folder with dataset.toml).",
            )
    else:
        candidates = [_apply_overrides(framework, r, options) for r in policy.recipes] or [
            _default_recipe(framework, fmt, p)
            for fmt in default_formats(framework)
            for p in (Precision.INT8, Precision.FP32)
        ]
        planned = []
        for recipe in candidates:
            if formats and recipe.format not in formats:
                continue
            refusal = supports(framework, recipe.format)
            if refusal is not None:
                skipped.append(_skip(recipe, refusal.message))
                continue
            if recipe.precision == Precision.INT8 and not has_calibration:
                skipped.append(_skip(recipe, "INT8 needs --calibration data"))
                continue
            too_old = backend_for(framework, recipe.format).profile_refusal(recipe, policy)
            if too_old is not None:
                skipped.append(_skip(recipe, too_old))
                continue
            planned.append(PlannedRecipe(recipe, False, When.A16W8_FALLBACK if recipe.a16w8 else When.ALWAYS))
        planned = _with_dynamic_fallback(planned, framework, options)
        planned.extend(_fallback_recipes(planned, policy, framework, options, has_calibration, skipped))
        for fmt in formats or tuple(dict.fromkeys(p.recipe.format for p in planned)) or default_formats(framework):
            if supports(framework, fmt) is None and not any(
                p.recipe.format == fmt and p.recipe.precision == Precision.FP32 for p in planned
            ):
                planned.append(PlannedRecipe(_plain_recipe(framework, fmt, Precision.FP32, options, ()), False))
    # what the target's CPU decides, settled by each format's backend (static INT8 ONNX: reduce_range)
    planned = [dataclasses.replace(p, recipe=backend_for(framework, p.recipe.format).planned(p.recipe, policy.arch))
               for p in planned]
    # fp32 of each format first: it is the baseline every other artifact is timed against (stable sort).
    planned.sort(key=lambda p: (FORMATS.index(p.recipe.format), p.recipe.precision != Precision.FP32))
    if framework == Framework.TFLITE:
        return _as_is_plan(planned, skipped, has_calibration, onnx_asked=Format.ONNX in formats, precision=as_is)
    return Plan(tuple(planned), tuple(skipped))


def _as_is_plan(planned: Sequence[PlannedRecipe], skipped: list[Attempt], has_calibration: bool, *,
                onnx_asked: bool, precision: Precision | None) -> Plan:
    """A .tflite source ships as it is as its one TFLite artifact, at the file's ``precision`` where known (the other
    TFLite recipes say why not); ONNX recipes are built from it (``onnx.from_tflite``) only when ``--format onnx`` asks,
    never just because the profile lists them."""
    tflite = [p for p in planned if p.recipe.format == Format.TFLITE]
    onnx = [p for p in planned if p.recipe.format == Format.ONNX] if onnx_asked else []
    chosen = tflite[:1] + onnx if tflite or onnx else list(planned)[:1]
    data_use = (
        ("the calibration data quantize the ONNX INT8 artifact built from it" if onnx else
         "the calibration data supply only the held-out inputs it is verified on and the golden data")
        if has_calibration
        else "no calibration data are needed"
    )
    others = [p.recipe for p in planned if p not in chosen]
    if tflite and precision is not None:  # "building tflite fp16" for the model.fp16.tflite it ships
        chosen[0] = dataclasses.replace(chosen[0], recipe=dataclasses.replace(chosen[0].recipe, precision=precision))
        others = [r for r in others if (r.format, r.precision) != (Format.TFLITE, precision)]
    if has_calibration and tflite and not any(
        r.format == Format.TFLITE and r.precision == Precision.INT8 for r in others
    ):
        # what the data would be for
        others.append(Recipe(format=Format.TFLITE, precision=Precision.INT8, io_dtype=IoDtype.INT8))
    for recipe in others:
        if recipe.format == Format.ONNX:
            skipped.append(_skip(recipe, "ONNX artifacts of a .tflite source are built only when asked for: pass "
                                         "--format onnx (with --calibration for INT8)"))
            continue
        skipped.append(_skip(recipe, (
            f"a .tflite source is taken as it is (its precision is fixed by the file), so {recipe.label} "
            f"does not apply; {data_use}. To quantize it, ask for --format onnx (ONNX INT8 built from the .tflite "
            "file with the calibration data) or convert from the original Keras/SavedModel or PyTorch model"
        )))
    return Plan(tuple(chosen), tuple(skipped))


def _with_dynamic_fallback(
    planned: Sequence[PlannedRecipe], framework: str, options: ConvertOptions
) -> list[PlannedRecipe]:
    """A conditional dynamic INT8 recipe after the static 8-bit INT8 recipes of each format that has them
    (before its A16W8 recipes: where dynamic INT8 fits, MatMul-heavy models, it is the faster fallback)."""
    out = list(planned)
    for fmt in dict.fromkeys(p.recipe.format for p in planned):
        same = [i for i, p in enumerate(out) if p.recipe.format == fmt]
        static_int8 = [i for i in same if out[i].recipe.precision == Precision.INT8 and not out[i].recipe.a16w8]
        if not static_int8 or any(out[i].recipe.precision == Precision.DYNAMIC for i in same):
            continue
        if not supports_precision(framework, fmt, Precision.DYNAMIC):
            continue
        last_int8 = max(static_int8)
        providers = out[last_int8].recipe.execution_providers
        recipe = dataclasses.replace(_plain_recipe(framework, fmt, Precision.DYNAMIC, options, ()),
                                     execution_providers=providers)
        out.insert(last_int8 + 1, PlannedRecipe(recipe, False, When.DYNAMIC_FALLBACK))
    return out


def _fallback_recipes(
    planned: Sequence[PlannedRecipe],
    policy: Policy,
    framework: str,
    options: ConvertOptions,
    has_calibration: bool,
    skipped: list[Attempt],
) -> list[PlannedRecipe]:
    """The profile's ``fallback`` precisions each format does not list a recipe for, after its own recipes
    (``["int8", "fp16", "fp32"]`` with int8 and fp32 recipes: fp16 is tried before fp32); built only when every
    earlier recipe of the format was dropped. fp32 is planned for every format anyway."""
    extra: list[PlannedRecipe] = []
    for fmt in dict.fromkeys(p.recipe.format for p in planned):
        have = {p.recipe.precision for p in planned if p.recipe.format == fmt}
        providers = next(
            (p.recipe.execution_providers for p in planned if p.recipe.format == fmt and p.recipe.execution_providers),
            (),
        )
        for precision in policy.fallback:
            if precision in have or precision == Precision.FP32:
                continue
            recipe = dataclasses.replace(_plain_recipe(framework, fmt, precision, options, ()),
                                         execution_providers=providers)
            if precision == Precision.INT8 and not has_calibration:
                skipped.append(Attempt(recipe, AttemptOutcome.FAILED,
                                       "skipped (fallback): INT8 needs --calibration data",
                                       workaround="pass --calibration with a few hundred representative samples"))
                continue
            extra.append(PlannedRecipe(recipe, False))
    return extra
