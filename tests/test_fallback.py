"""The fallback path on a model where full INT8 really breaks the tolerance.

The model: digits -> Flatten -> Dense(64, relu) -> Dense(10, softmax), trained, then ONE hidden unit scaled by
4000 and the matching row of the last layer by 1/4000. ReLU is positively homogeneous, so the float model
computes the same function; but the hidden activations now have one extreme outlier channel, so the per-tensor
int8 scale of that tensor is set by the outlier and the other 63 units collapse to a few levels. Keeping the
layers around it in float (selective quantization) or falling back to fp16/fp32 fixes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolkit.pipeline import ConvertOptions, ConvertResult, convert_bundle

OUTLIER = 4000.0


@pytest.fixture(scope="session")
def outlier_keras(digits, tmp_path_factory) -> Path:
    import keras

    path = tmp_path_factory.mktemp("outlier") / "outlier.keras"
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(64, activation="relu", name="hidden")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(digits.x_train, digits.y_train, epochs=30, batch_size=32, verbose=0)
    hidden, head = model.get_layer("hidden"), model.get_layer("head")
    kernel, bias = hidden.get_weights()
    activations = np.maximum(digits.x_train.reshape(len(digits.x_train), -1) @ kernel + bias, 0)
    unit = int(np.argmax(activations.mean(axis=0)))  # a unit that is active: its outlier shows in calibration
    kernel[:, unit] *= OUTLIER
    bias[unit] *= OUTLIER
    hidden.set_weights([kernel, bias])
    head_kernel, head_bias = head.get_weights()
    head_kernel[unit, :] /= OUTLIER
    head.set_weights([head_kernel, head_bias])
    model.save(path)
    return path


@pytest.fixture(scope="session")
def outlier_bundle(outlier_keras, digits_calibration, digits_eval, tmp_path_factory) -> ConvertResult:
    """A user profile whose fallback order is int8 -> (mixed int8/float) -> fp16 -> fp32."""
    folder = tmp_path_factory.mktemp("fallback-profiles")
    (folder / "pi4-fallback.toml").write_text(
        'extends = "raspberry-pi-4"\n'
        'fallback = ["int8", "fp16", "fp32"]\n'
        '[[recipes]]\nformat = "tflite"\nprecision = "int8"\nio_dtype = "int8"\n'
        '[[recipes]]\nformat = "tflite"\nprecision = "fp32"\n'
    )
    return convert_bundle(
        ConvertOptions(source=str(outlier_keras), target="pi4-fallback", targets_dirs=(folder,),
                       calibration=digits_calibration, eval_data=digits_eval,
                       out=tmp_path_factory.mktemp("fallback") / "b", use_cache=False),
        progress=lambda message: None,
    )


def _accuracy(attempt) -> float:
    return attempt.metrics["verification"]["accuracy"]


def test_int8_really_breaks_the_tolerance_and_is_dropped(outlier_bundle: ConvertResult) -> None:
    manifest = outlier_bundle.manifest
    fp32 = manifest.artifact("model.fp32.tflite")
    assert fp32.verification is not None and fp32.verification.accuracy is not None
    assert fp32.verification.accuracy > 0.9
    plain = [a for a in manifest.attempts if a.recipe["precision"] == "int8" and not a.recipe["nodes_to_exclude"]]
    assert len(plain) == 1 and plain[0].outcome == "dropped"
    assert "top-1" in plain[0].reason or "cosine" in plain[0].reason, plain[0].reason
    # The outlier ruins it: far beyond the profile's one point of top-1.
    assert _accuracy(plain[0]) < fp32.verification.accuracy - 0.05, (_accuracy(plain[0]), fp32.verification.accuracy)


def test_selective_quantization_or_fallback_is_recorded(outlier_bundle: ConvertResult) -> None:
    manifest = outlier_bundle.manifest
    print(json.dumps([{"recipe": f"{a.recipe['precision']} float={a.recipe['nodes_to_exclude']}",
                       "outcome": a.outcome, "reason": a.reason,
                       "accuracy": (a.metrics or {}).get("verification", {}) and _accuracy(a)}
                      for a in manifest.attempts], indent=1))
    mixed = [a for a in manifest.attempts if a.recipe["precision"] == "int8" and a.recipe["nodes_to_exclude"]]
    assert mixed, "selective quantization was not tried"
    preferred = [r for r in manifest.artifacts if r.preferred]
    assert len(preferred) == 1
    kept_mixed = [a for a in mixed if a.outcome == "kept"]
    if kept_mixed:
        record = manifest.artifact("model.int8.tflite")
        assert record.precision == "int8" and record.float_nodes  # the label stays int8; float nodes listed
        assert record.preferred and record.verification is not None
        assert record.verification.accuracy >= record.verification.reference_accuracy - 0.01
    else:
        assert all(a.outcome == "dropped" and a.reason for a in mixed)
        fp16 = [a for a in manifest.attempts if a.recipe["precision"] == "fp16"]
        assert fp16, "the profile's fallback order (int8 -> fp16 -> fp32) was not honoured"
        assert preferred[0].precision in ("fp16", "fp32")
