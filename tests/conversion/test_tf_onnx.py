"""Keras/SavedModel -> ONNX through tf2onnx, run in the real ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from tests.fixtures.tflite import digits_request
from toolkit.conversion.onnx import from_tf as tf_onnx
from toolkit.sources import open_source


def test_sequential_model_exports_and_matches_keras(digits, digits_keras_sequential, tmp_path):
    source = open_source(str(digits_keras_sequential))
    request = digits_request(source, digits, tmp_path / "w", format="onnx", precision="fp32")
    built = tf_onnx.export(request, tmp_path / "seq.onnx")
    assert built.exporter and "tf2onnx" in built.exporter
    model = onnx.load(str(built.path))
    assert model.opset_import[0].version == 17 or any(
        o.version == 17 for o in model.opset_import if o.domain == ""
    )
    session = ort.InferenceSession(str(built.path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["image"]
    assert session.get_inputs()[0].shape == [1, 8, 8, 1]
    assert [o.name for o in session.get_outputs()] == [o.name for o in source.outputs]
    worst = 0.0
    for x in digits.x_heldout[:50]:
        got = session.run(None, {"image": x[None]})[0]
        worst = max(worst, float(np.abs(got - source.predict({"image": x[None]})[0]).max()))
    assert worst < 1e-4


def test_dynamic_batch_and_lower_opset(digits, digits_source, tmp_path):
    request = digits_request(
        digits_source,
        digits,
        tmp_path / "w",
        format="onnx",
        precision="fp32",
        dynamic_batch=True,
        max_opset=13,
    )
    built = tf_onnx.export(request, tmp_path / "dyn.onnx")
    model = onnx.load(str(built.path))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [13]
    session = ort.InferenceSession(str(built.path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[0] == "batch"
    got = session.run(None, {"image": digits.x_heldout[:16]})[0]
    expected = digits_source.predict({"image": digits.x_heldout[:16]})[0]
    assert got.shape == (16, 10) and np.abs(got - expected).max() < 1e-4


def test_savedmodel_source_exports(digits, digits_source, tmp_path):
    export_dir = tmp_path / "exported"
    digits_source.model.export(str(export_dir), verbose=False)
    source = open_source(str(export_dir))
    request = digits_request(source, digits, tmp_path / "w", format="onnx", precision="fp32")
    built = tf_onnx.export(request, tmp_path / "sm.onnx")
    session = ort.InferenceSession(str(built.path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["image"]
    assert [o.name for o in session.get_outputs()] == ["output_0"]
    x = digits.x_heldout[:1]
    assert np.abs(session.run(None, {"image": x})[0] - digits_source.predict({"image": x})[0]).max() < 1e-4
