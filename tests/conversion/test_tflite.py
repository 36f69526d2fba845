"""Keras/SavedModel -> TFLite with the real converter, checked in the real runtime (ai-edge-litert)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.tflite import digits_request
from toolkit.conversion.tflite import table as layers
from toolkit.conversion.tflite import convert as tflite
from toolkit.conversion.tflite import checks as tflite_checks
from toolkit.errors import ConversionError, UsageError
from toolkit.runtimes.execution.tflite import TFLiteSession
from toolkit.runtimes.inspection.tflite import float_op_outputs, inspect_tflite


def accuracy(path: Path, digits: Any) -> float:
    session = TFLiteSession(path)
    predictions = [int(session.run({"image": x[None]})[0].argmax()) for x in digits.x_heldout]
    return float(np.mean(np.array(predictions) == digits.y_heldout))


def test_int8_accuracy_within_one_point_of_float(digits, digits_source, digits_tflite):
    assert len(digits.x_heldout) == 497
    reference = digits_source.predict({"image": digits.x_heldout})[0].argmax(1)
    float_acc = float(np.mean(reference == digits.y_heldout))
    assert float_acc > 0.9
    assert abs(accuracy(digits_tflite["fp32"], digits) - float_acc) < 1e-9
    assert accuracy(digits_tflite["int8"], digits) >= float_acc - 0.01


def test_sizes_and_quantized_ops(digits_tflite):
    fp32 = digits_tflite["fp32"].stat().st_size
    assert digits_tflite["int8"].stat().st_size <= 0.3 * fp32
    assert digits_tflite["fp16"].stat().st_size <= 0.55 * fp32
    int8 = inspect_tflite(digits_tflite["int8"])
    assert int8.precision == "int8"
    assert int8.quantized_ops >= 5 and int8.float_compute_ops == 0
    assert int8.inputs[0].dtype == "int8" and int8.inputs[0].quantization is not None
    assert int8.inputs[0].shape == (1, 8, 8, 1)  # static shapes, batch 1
    assert inspect_tflite(digits_tflite["dynamic"]).precision == "dynamic"
    assert inspect_tflite(digits_tflite["fp16"]).precision == "fp16"
    assert inspect_tflite(digits_tflite["fp32"]).quantized_ops == 0


@pytest.mark.parametrize("io_dtype", ["uint8", "float32"])
def test_int8_io_types(io_dtype, digits, digits_source, tmp_path):
    request = digits_request(digits_source, digits, tmp_path / "w", precision="int8", io_dtype=io_dtype)
    built = tflite.convert(request, tmp_path / "m.tflite")
    info = inspect_tflite(built.path)
    assert info.inputs[0].dtype == io_dtype and info.outputs[0].dtype == io_dtype
    assert info.quantized_ops >= 5
    assert accuracy(built.path, digits) > 0.9


def test_sequential_and_savedmodel_sources(digits, digits_keras_sequential, digits_source, tmp_path):
    from toolkit.sources import open_source

    export_dir = tmp_path / "exported"
    digits_source.model.export(str(export_dir), verbose=False)  # the user's plain SavedModel, dynamic batch
    for source in (open_source(str(digits_keras_sequential)), open_source(str(export_dir))):
        request = digits_request(
            source, digits, tmp_path / f"w-{source.framework}", precision="int8", io_dtype="int8"
        )
        built = tflite.convert(request, tmp_path / f"{source.framework}.tflite")
        assert accuracy(built.path, digits) > 0.95
        assert inspect_tflite(built.path).inputs[0].shape == (1, 8, 8, 1)


def test_selective_quantization_keeps_named_nodes_float(digits, digits_source, tmp_path):
    request = digits_request(digits_source, digits, tmp_path / "w", precision="int8", io_dtype="int8")
    worst = layers.tflite_table(request).rows[:3]
    assert len(worst) == 3
    assert worst[0].channel_error >= worst[1].channel_error >= worst[2].channel_error > 0, worst
    chosen = worst[0].name
    request = digits_request(
        digits_source, digits, tmp_path / "w", precision="int8", io_dtype="int8", nodes_to_exclude=(chosen,)
    )
    built = tflite.convert(request, tmp_path / "selective.tflite")
    assert built.float_nodes == (chosen,)
    kept = float_op_outputs(built.path)
    assert any(chosen.startswith(name) for name in kept), f"{chosen} not in {kept}"
    info = inspect_tflite(built.path)
    assert info.float_compute_ops >= 1 and info.quantized_ops >= 4
    assert accuracy(built.path, digits) > 0.95

    # A Keras layer name works too: the last Dense layer stays float.
    by_layer = digits_request(
        digits_source,
        digits,
        tmp_path / "w",
        precision="int8",
        io_dtype="float32",
        nodes_to_exclude=("dense_1",),
    )
    built = tflite.convert(by_layer, tmp_path / "by-layer.tflite")
    kept = float_op_outputs(built.path)
    assert len(kept) == 1 and "MatMul" in kept[0] and "Relu" not in kept[0], kept  # dense_1 is the last Dense
    # every float op was asked for, so no "also float" note; the same artifact judged as if nothing had been
    # asked names the float FULLY_CONNECTED (a mixed-mode build never leaves an op float silently)
    assert not any(n.startswith("also float") for n in built.notes), built.notes
    (unasked,) = tflite_checks.unasked_float(built.path, ())
    assert unasked.startswith("also float without being asked (1 op(s)") and "FULLY_CONNECTED x1" in unasked

    unknown = digits_request(
        digits_source, digits, tmp_path / "w", precision="int8", nodes_to_exclude=("no_such_layer",)
    )
    with pytest.raises(UsageError, match="no_such_layer"):
        tflite.convert(unknown, tmp_path / "unknown.tflite")
    assert not (tmp_path / "unknown.tflite").exists()


def test_sanity_check_catches_nan_models(digits, digits_source, tmp_path):
    """Converting a Keras 3 model through a graph whose variables were never frozen gives NaN outputs
    (findings.md: from_concrete_functions; here reproduced deterministically by saving the model inside a
    plain tf.Module, which does not track Keras 3 variables). The sanity check must refuse such a model."""
    import tensorflow as tf

    module = tf.Module()
    module.model = digits_source.model
    module.serve = digits_source.serving_function({"image": (1, 8, 8, 1)})
    tf.saved_model.save(module, str(tmp_path / "untracked"), signatures={"serving_default": module.serve})
    bad = tmp_path / "nan.tflite"
    bad.write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "untracked")).convert())
    request = digits_request(digits_source, digits, tmp_path / "w", precision="fp32")
    outputs = TFLiteSession(bad).run(request.calibration[0])
    assert not np.all(np.isfinite(outputs[0]))  # the failure class really happens with this stack
    with pytest.raises(ConversionError, match="non-finite"):
        tflite.sanity_check(bad, request)
    tflite.sanity_check(tflite.convert(request, tmp_path / "ok.tflite").path, request)


def test_int8_without_calibration_is_a_usage_error(digits, digits_source, tmp_path):
    from dataclasses import replace

    request = replace(digits_request(digits_source, digits, tmp_path / "w", precision="int8"), calibration=())
    with pytest.raises(UsageError, match="calibration"):
        tflite.convert(request, tmp_path / "x.tflite")
    assert not (tmp_path / "x.tflite").exists()


def test_converter_failure_becomes_conversion_error(digits, digits_source, tmp_path, monkeypatch):
    """A converter exception is reported by its key line, and nothing is left at the output path."""

    class Broken:
        def convert(self):
            raise RuntimeError(
                "loc(fused): error: 'tfl.conv_2d' op quantization failed\nTraceback (most recent...)"
            )

    monkeypatch.setattr(tflite, "_converter", lambda request, **_: Broken())
    request = digits_request(digits_source, digits, tmp_path / "w", precision="fp32")
    with pytest.raises(ConversionError) as caught:
        tflite.convert(request, tmp_path / "x.tflite")
    assert "error: 'tfl.conv_2d' op quantization failed" in caught.value.message
    assert "Traceback" not in caught.value.message
    assert list(tmp_path.glob("*.tflite")) == [] and list(tmp_path.glob(".x.tflite*")) == []


def test_a16w8_is_the_16x8_converter_build_with_float_io(digits, digits_source, tmp_path):
    """A16W8 (16-bit activations, 8-bit weights): the converter's 16x8 ops set, float I/O, every compute op
    int16-activation (int8 weights), labelled as such; on the trained digits CNN its top-1 agrees with the
    float model's on the 497 held-out digits as closely as int8 does, or closer."""
    from tensorflow.lite.python import schema_py_generated as fb
    from tensorflow.lite.python import util as tf_util

    request = digits_request(digits_source, digits, tmp_path / "w", precision="int8", activation_type="int16",
                             io_dtype="float32")
    assert request.recipe.label == "tflite int8 (A16W8, float32 io)"
    built = tflite.convert(request, tmp_path / "m.tflite")
    assert "16x8" in (built.exporter or "")
    info = inspect_tflite(built.path)
    assert info.precision == "int8" and info.float_compute_ops == 0 and info.quantized_ops >= 5
    assert info.inputs[0].dtype == "float32" and info.outputs[0].dtype == "float32"
    model = tf_util._convert_model_from_bytearray_to_object(built.path.read_bytes())
    graph = model.subgraphs[0]
    names = {v: k for k, v in vars(fb.BuiltinOperator).items() if not k.startswith("_")}
    compute = [op for op in graph.operators
               if names[max(model.operatorCodes[op.opcodeIndex].builtinCode,
                            model.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode)]
               in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")]
    assert len(compute) >= 3
    for op in compute:
        activation, weights = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        assert activation.type == fb.TensorType.INT16 and weights.type == fb.TensorType.INT8
        assert graph.tensors[op.outputs[0]].type == fb.TensorType.INT16
    reference = digits_source.predict({"image": digits.x_heldout})[0].argmax(1)
    session = TFLiteSession(built.path)
    a16w8 = np.array([int(session.run({"image": x[None]})[0].argmax()) for x in digits.x_heldout])
    assert np.mean(a16w8 == reference) >= 0.99  # measured 2026-12-01: 1.000 (int8 with float I/O: 0.998)
    with pytest.raises(UsageError, match="float32 input/output"):
        digits_request(digits_source, digits, tmp_path / "w", precision="int8", activation_type="int16",
                       io_dtype="int8")
