"""Keras and SavedModel sources: I/O read from the model, reference predictions, clear errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import UsageError
from toolkit.sources import open_source
from toolkit.sources.tensorflow import open_tensorflow


def test_keras_functional_and_sequential(digits, digits_keras, digits_keras_sequential):
    for path in (digits_keras, digits_keras_sequential):
        source = open_source(str(path))
        assert source.framework == "keras"
        assert [(s.name, s.shape, s.dtype) for s in source.inputs] == [("image", (None, 8, 8, 1), "float32")]
        assert len(source.outputs) == 1 and source.outputs[0].shape == (None, 10)
        out = source.predict({"image": digits.x_heldout})
        assert isinstance(out, list) and out[0].dtype == np.float32
        assert np.mean(out[0].argmax(1) == digits.y_heldout) > 0.9


def test_savedmodel_directory(digits, digits_source, tmp_path):
    directory = tmp_path / "sm"
    digits_source.model.export(str(directory), verbose=False)
    source = open_source(str(directory))
    assert source.framework == "savedmodel"
    assert [(s.name, s.shape) for s in source.inputs] == [("image", (None, 8, 8, 1))]
    assert [s.name for s in source.outputs] == ["output_0"]
    x = digits.x_heldout[:8]
    np.testing.assert_allclose(
        source.predict({"image": x})[0], digits_source.predict({"image": x})[0], atol=1e-6
    )


def test_export_with_fixed_shapes_keeps_weights(digits, digits_source, tmp_path):
    directory = digits_source.export_saved_model(tmp_path / "fixed", {"image": (1, 8, 8, 1)})
    fixed = open_source(str(directory))
    assert fixed.inputs[0].shape == (1, 8, 8, 1)
    assert [s.name for s in fixed.outputs] == [s.name for s in digits_source.outputs]
    x = digits.x_heldout[:1]
    np.testing.assert_allclose(
        fixed.predict({"image": x})[0], digits_source.predict({"image": x})[0], atol=1e-6
    )


def test_truncated_and_corrupt_keras_files(digits_keras, tmp_path):
    truncated = tmp_path / "truncated.keras"
    truncated.write_bytes(digits_keras.read_bytes()[:4096])
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"this is not a model" * 10)
    for path in (truncated, garbage):
        with pytest.raises(UsageError) as caught:
            open_source(str(path))
        message = caught.value.message
        assert path.name in message and "Traceback" not in message and "\n" not in message


def test_directory_that_is_not_a_savedmodel(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="not a SavedModel"):
        open_source(str(empty))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"\x00garbage")
    with pytest.raises(UsageError) as caught:
        open_tensorflow(broken, "savedmodel")
    assert "Cannot load the SavedModel" in caught.value.message and "Traceback" not in caught.value.message


def test_missing_feed_is_named(digits_source):
    with pytest.raises(UsageError, match="image"):
        digits_source.predict({"x": np.zeros((1, 8, 8, 1), np.float32)})
