"""A trained step model (a GRU cell predicting a sine wave, state as an input and an output) verified over a
sequence with each model's own state fed back, as a streaming device runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.real_models import StepModel
from toolkit import api


def _artifacts(model: StepModel, out: Path, calibration: Path, precisions: list[str], formats: list[str]) -> dict[str, Any]:
    api.convert(model.model, calibration=calibration, eval_data=model.eval_data, precisions=precisions,
                formats=formats, out=out, use_cache=False, progress=lambda message: None)
    manifest = json.loads((out / "manifest.json").read_text())
    reasons = {a.get("file"): a["reason"] for a in manifest["attempts"]}
    return {a["file"]: dict(a, reason=reasons.get(a["file"], "")) for a in manifest["artifacts"]}


def test_the_step_model_is_trained(sine_step_model: StepModel) -> None:
    import keras

    model = keras.saving.load_model(sine_step_model.model, compile=False)
    x = np.load(sine_step_model.eval_data)["x"][:, 0]
    h = np.zeros((1, 16), np.float32)
    errors = []
    for t in range(len(x) - 1):
        y, h = model([np.array([[x[t]]], np.float32), h])
        h = np.asarray(h)
        errors.append(float(np.asarray(y)[0, 0]) - float(x[t + 1]))
    assert np.sqrt(np.mean(np.square(errors[5:]))) < 0.2 * float(np.std(x))  # it predicts the next value


def test_verified_over_a_sequence_with_the_state_fed_back(sine_step_model: StepModel, tmp_path: Path) -> None:
    artifacts = _artifacts(sine_step_model, tmp_path / "b", sine_step_model.calibration, ["fp32", "int8"],
                           ["tflite", "onnx"])
    for name in ("model.fp32.tflite", "model.fp32.onnx", "model.int8.tflite"):
        v = artifacts[name]["verification"]
        assert v["task"] == "recurrent" and "state_out -> state" in v["task_source"], name
        m = v["task_metrics"]
        assert m["sequence_steps"] == 60 and m["sequence_state"] == "state_out -> state"
    for name in ("model.fp32.tflite", "model.fp32.onnx"):  # the ONNX export keeps both outputs' names
        assert artifacts[name]["verification"]["task_metrics"]["sequence_relative_error"] < 1e-5, name
    int8 = artifacts["model.int8.tflite"]["verification"]["task_metrics"]
    # calibrated with the states the model really carries: INT8 stays close over the whole sequence
    assert int8["sequence_relative_error"] < 0.15
    assert "state fed back" not in artifacts["model.int8.tflite"]["reason"]


def test_state_calibrated_at_zero_breaks_only_with_feedback(sine_step_model: StepModel, tmp_path: Path) -> None:
    """Calibrated with zero states, INT8 clips the state's range: each step alone looks fine (the eval steps
    start from zero too), the stream drifts away once the state is fed back."""
    calib = np.load(sine_step_model.calibration)
    zero = tmp_path / "zero-state.npz"
    np.savez(zero, x=calib["x"], state=np.zeros_like(calib["state"]))
    record = _artifacts(sine_step_model, tmp_path / "b", zero, ["int8"], ["tflite"])["model.int8.tflite"]
    v = record["verification"]
    m = v["task_metrics"]
    assert v["cosine_similarity"] > 0.99 and m["step_relative_error_without_feedback"] < 0.05
    assert m["sequence_relative_error"] > 0.15 > m["step_relative_error_without_feedback"]
    assert record["status"] == "out_of_tolerance"
    assert "over 60 steps with the state fed back (state_out -> state)" in record["reason"]


@pytest.mark.parametrize("names, expected", [
    ((("x", (None, 1)), ("state", (None, 16))), ((("state_out", (None, 16)), ("y", (None, 1))), [("state", 0)])),
])
def test_state_pairs_match_by_shape_and_name(names, expected) -> None:
    from toolkit.model.tensors import TensorSpec
    from toolkit.verification.verify import state_pairs

    inputs = [TensorSpec(n, s, "float32") for n, s in names]
    outputs = [TensorSpec(n, s, "float32") for n, s in expected[0]]
    assert [(p.input, p.output) for p in state_pairs(inputs, outputs)] == expected[1]
    assert state_pairs(inputs[:1], outputs) == ()  # one input: nothing to feed back into
