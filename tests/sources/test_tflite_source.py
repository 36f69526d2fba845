"""A .tflite taken as it is: I/O and quantization read from the file, predictions from LiteRT."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import UsageError
from toolkit.sources import open_source
from toolkit.runtimes.inspection.tflite import inspect_tflite
from toolkit.sources.tflite import TFLiteSource


def test_int8_tflite_source(digits, digits_source, digits_tflite):
    source = open_source(str(digits_tflite["int8"]))
    assert isinstance(source, TFLiteSource) and source.framework == "tflite"
    spec = source.inputs[0]
    assert (spec.name, spec.shape, spec.dtype) == ("image", (1, 8, 8, 1), "int8")
    assert spec.quantization is not None and spec.quantization.scale[0] > 0
    assert source.outputs[0].dtype == "int8" and source.outputs[0].quantization is not None
    x = digits.x_heldout[:1]
    got = source.predict({"image": x})[0]
    assert got.dtype == np.float32 and abs(float(got.sum()) - 1.0) < 0.05  # dequantized softmax
    assert got.argmax() == digits_source.predict({"image": x})[0].argmax()


def test_detect_precision(digits_tflite):
    assert {p: inspect_tflite(path).precision for p, path in digits_tflite.items()} == {
        "fp32": "fp32",
        "fp16": "fp16",
        "dynamic": "dynamic",
        "int8": "int8",
    }


def test_not_a_tflite_file(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(UsageError, match="not a TFLite model"):
        TFLiteSource(bad)
