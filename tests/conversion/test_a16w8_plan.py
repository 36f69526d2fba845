"""Where the A16W8 recipe (16-bit activations, 8-bit weights) sits in a run's plan: after the 8-bit INT8 recipe
of its format and the dynamic fallback, conditional on the 8-bit one losing, and skipped with the reason on a
profile whose onnxruntime floor cannot run int16 Q/DQ. Planning only: nothing is converted here."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit.conversion.plan import When, plan_recipes
from toolkit.conversion.policy import policy_for
from toolkit.errors import UsageError
from toolkit.model.options import ConvertOptions
from toolkit.model.targets import get_profile
from toolkit.model.recipe import Recipe


def _onnx_rows(plan):  # (label, when) of the ONNX recipes, in build order
    return [(p.recipe.label, p.when) for p in plan.recipes if p.recipe.format == "onnx"]


def test_a16w8_is_planned_after_int8_and_dynamic_as_a_conditional_fallback() -> None:
    policy = policy_for(get_profile("generic-x86_64"))
    plan = plan_recipes(ConvertOptions(source="m.keras"), policy, "keras", has_calibration=True)
    assert _onnx_rows(plan) == [
        ("onnx fp32", When.ALWAYS),
        ("onnx int8 (U8S8 qdq minmax reduce_range)", When.ALWAYS),  # an x86 target: 7-bit weights
        ("onnx dynamic", When.DYNAMIC_FALLBACK),
        ("onnx int8 (A16W8 qdq minmax)", When.A16W8_FALLBACK),
    ]
    assert not [p for p in plan.recipes if p.recipe.format == "tflite" and p.recipe.a16w8]


def test_precision_int8_builds_the_8bit_recipe_not_a16w8() -> None:
    policy = policy_for(get_profile("generic-x86_64"))
    options = ConvertOptions(source="m.keras", precisions=("int8",), formats=("onnx",))
    plan = plan_recipes(options, policy, "keras", has_calibration=True)
    assert [p.recipe.label for p in plan.recipes] == ["onnx int8 (U8S8 qdq minmax reduce_range)"]


def test_a16w8_is_skipped_with_the_reason_where_onnxruntime_is_too_old() -> None:
    policy = dataclasses.replace(policy_for(get_profile("generic-x86_64")), onnxruntime_min="1.16")
    plan = plan_recipes(ConvertOptions(source="m.keras"), policy, "keras", has_calibration=True)
    assert not any(p.recipe.a16w8 for p in plan.recipes)
    (skipped,) = [a for a in plan.skipped if a.recipe.activation_type == "int16"]
    assert "onnxruntime >= 1.17" in skipped.reason and "1.16" in skipped.reason


@pytest.mark.parametrize(("changes", "key"), [
    ({"precision": "fp32"}, "activation_type"),
    ({"quant_format": "qoperator"}, "quant_format"),
    ({"weight_type": "uint8"}, "weight_type"),
    ({"format": "tflite", "io_dtype": "int8"}, "io_dtype"),
])
def test_a16w8_recipes_the_converters_cannot_build_are_refused_by_key(changes, key) -> None:
    fields = {"format": "onnx", "precision": "int8", "activation_type": "int16", **changes}
    with pytest.raises(UsageError) as caught:
        Recipe(**fields)
    assert getattr(caught.value, "key", None) == key, caught.value.message
    assert "int16" in (caught.value.hint or "")


def test_pytorch_to_tflite_refuses_a16w8_naming_the_onnx_route(torch_nets_file, tmp_path) -> None:
    """litert-torch's PT2E path quantizes activations to 8 bits only: an A16W8 TFLite recipe of a PyTorch
    source is refused before any export, with the route that builds A16W8 (ONNX) in the hint."""
    from toolkit.conversion import registry
    from toolkit.conversion.base import ConversionRequest
    from toolkit.sources import open_source

    source = open_source(f"{torch_nets_file}:make_digits_net")
    request = ConversionRequest(source=source, recipe=Recipe("tflite", "int8", activation_type="int16"),
                                input_shapes={}, calibration=(), workdir=tmp_path)
    with pytest.raises(UsageError) as caught:
        registry.build(request, tmp_path / "m.tflite")
    assert "8 bits only" in caught.value.message and "--format onnx" in (caught.value.hint or "")
    assert not (tmp_path / "m.tflite").exists()
