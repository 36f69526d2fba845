"""OnnxSource: I/O read from the graph (None for dynamic dims), predictions from the original model in
onnxruntime, and plain UsageErrors for files that are not (complete) ONNX models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from toolkit.errors import UsageError
from toolkit.sources.detect import open_source
from toolkit.sources.onnx import OnnxSource


def test_io_from_the_graph(conv_net_onnx: Path) -> None:
    source = open_source(str(conv_net_onnx))
    assert isinstance(source, OnnxSource) and source.framework == "onnx"
    assert [(s.name, s.shape, s.dtype) for s in source.inputs] == [("x", (None, 3, 16, 16), "float32")]
    assert [(s.name, s.shape, s.dtype) for s in source.outputs] == [("logits", (None, 10), "float32")]


def test_predict_runs_the_original_model(conv_net_onnx: Path) -> None:
    from onnx.reference import ReferenceEvaluator

    source = OnnxSource(conv_net_onnx)
    x = np.random.default_rng(1).random((3, 3, 16, 16), dtype=np.float32)
    (logits,) = source.predict({"x": x})
    assert logits.shape == (3, 10) and np.std(logits) > 0
    # onnx's own reference implementation, independent of onnxruntime
    (expected,) = ReferenceEvaluator(str(conv_net_onnx)).run(None, {"x": x})
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    # float64 feeds are cast to the model's dtype rather than rejected
    np.testing.assert_allclose(source.predict({"x": x.astype(np.float64)})[0], logits, atol=1e-6)


def test_ppocr_dims_are_dynamic(ppocr_det: Path) -> None:
    source = OnnxSource(ppocr_det)
    assert source.inputs[0].shape == (None, 3, None, None)
    assert source.outputs[0].shape == (None, 1, None, None)
    assert source.opset == 12


@pytest.mark.parametrize("keep", [0.5, 0.1, 0.999])
def test_truncated_file_is_a_usage_error(conv_net_onnx: Path, tmp_path: Path, keep: float) -> None:
    data = conv_net_onnx.read_bytes()
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(UsageError) as info:
        source = OnnxSource(broken)
        source.predict({"x": np.zeros((1, 3, 16, 16), np.float32)})
    message = str(info.value)
    assert "broken.onnx" in message and "Traceback" not in message


def test_not_an_onnx_file(tmp_path: Path) -> None:
    junk = tmp_path / "model.onnx"
    junk.write_text("this is not a model\n" * 10)
    with pytest.raises(UsageError, match="not a readable ONNX model|not a complete ONNX model"):
        OnnxSource(junk)


def test_missing_input_is_named(conv_net_onnx: Path) -> None:
    with pytest.raises(UsageError, match="x"):
        OnnxSource(conv_net_onnx).predict({})
