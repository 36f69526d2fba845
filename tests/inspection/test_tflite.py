"""Reading .tflite flatbuffers: I/O, quantization, op counts over every subgraph, precision guess."""

from __future__ import annotations

import pytest

from toolkit.errors import UsageError
from toolkit.runtimes.inspection import inspect_model
from toolkit.runtimes.inspection.tflite import inspect_tflite


def test_op_counts_and_quantization(digits_tflite):
    fp32 = inspect_model(digits_tflite["fp32"])
    assert fp32.format == "tflite" and fp32.bytes == digits_tflite["fp32"].stat().st_size
    assert fp32.op_counts.get("CONV_2D") == 2 and fp32.op_counts.get("FULLY_CONNECTED") == 2
    assert fp32.quantized_ops == 0 and fp32.float_compute_ops >= 6
    int8 = inspect_tflite(digits_tflite["int8"])
    assert int8.op_counts.get("CONV_2D") == 2
    assert int8.quantized_ops == sum(
        c for op, c in int8.op_counts.items() if op not in ("QUANTIZE", "DEQUANTIZE")
    )
    q = int8.outputs[0].quantization
    assert q is not None and len(q.scale) == 1 and q.axis is None
    dynamic = inspect_tflite(digits_tflite["dynamic"])
    assert dynamic.precision == "dynamic" and dynamic.extra["hybrid_ops"] >= 3
    assert int8.to_dict()["inputs"][0]["quantization"]["zero_point"]


def test_counts_ops_in_every_subgraph(tmp_path):
    """A model with a while loop has a body subgraph; its ops must be counted too."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec((1, 4), tf.float32)])
    def loop(x):
        i = tf.constant(0)
        _, y = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.tanh(v) * 2.0), [i, x])
        return y

    converter = tf.lite.TFLiteConverter.from_concrete_functions([loop.get_concrete_function()])
    path = tmp_path / "loop.tflite"
    path.write_bytes(converter.convert())
    info = inspect_tflite(path)
    assert info.extra["subgraphs"] >= 2
    assert info.op_counts.get("TANH") == 1 and info.op_counts.get("WHILE") == 1


def test_not_a_flatbuffer(tmp_path, digits_tflite):
    text = tmp_path / "a.tflite"
    text.write_text("hello")
    with pytest.raises(UsageError, match="not a TFLite model"):
        inspect_tflite(text)
    truncated = tmp_path / "t.tflite"
    truncated.write_bytes(digits_tflite["fp32"].read_bytes()[:200])
    with pytest.raises(UsageError):
        inspect_tflite(truncated)
