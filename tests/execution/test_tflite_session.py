"""TFLiteSession runs artifacts in ai-edge-litert with the signature's I/O names."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import UsageError
from toolkit.runtimes.execution import open_session
from toolkit.runtimes.execution.tflite import TFLiteSession


def test_runs_many_times_and_matches_float(digits, digits_source, digits_tflite):
    session = open_session(digits_tflite["fp32"], threads=1)
    assert isinstance(session, TFLiteSession) and session.runtime == "litert"
    assert [s.name for s in session.inputs] == ["image"]
    expected = digits_source.predict({"image": digits.x_heldout[:20]})[0]
    got = np.concatenate([session.run({"image": x[None]})[0] for x in digits.x_heldout[:20]])
    assert np.abs(got - expected).max() < 1e-5


def test_int8_io_quantize_and_raw(digits, digits_tflite):
    session = TFLiteSession(digits_tflite["int8"])
    x = digits.x_heldout[:1]
    raw = session.run_raw({"image": np.zeros((1, 8, 8, 1), np.int8)})
    assert raw[0].dtype == np.int8
    out = session.run({"image": x})[0]
    assert out.dtype == np.float32 and out.shape == (1, 10)


def test_wrong_shape_and_missing_input(digits_tflite):
    session = TFLiteSession(digits_tflite["fp32"])
    with pytest.raises(UsageError, match="shape"):
        session.run({"image": np.zeros((1, 4, 4, 1), np.float32)})
    with pytest.raises(UsageError, match="image"):
        session.run({})
