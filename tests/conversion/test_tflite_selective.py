"""Keras -> TFLite INT8: the layer-wise error table and selective quantization with int8 I/O.

The conv-outlier model: digits -> Conv2D(8, relu) "conv" -> Conv2D(16, relu) "mid" -> MaxPool -> Flatten ->
Dense(10) "logits" (no softmax), trained, then ONE conv channel scaled by 4000 and the mid kernel's input channel
reading it by 1/4000. ReLU is positively homogeneous, so the float model computes the same function; but the conv
output's per-tensor int8 scale is set by the outlier channel and the other seven channels collapse: full INT8
loses the model. The layers to keep in float are the conv, which reads the model's input, and mid, which
re-quantizes its output; keeping the logits layer float too puts the island at the output as well: the test of
int8 I/O kept by quantize/dequantize ops at the island's borders.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.tflite import digits_request

OUTLIER = 4000.0


@pytest.fixture(scope="session")
def conv_outlier_keras(digits: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import keras

    keras.utils.set_random_seed(2)
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv")(inputs)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="mid")(x)
    x = keras.layers.MaxPooling2D(2, name="pool")(x)  # every layer named: Keras numbers unnamed ones per process
    x = keras.layers.Flatten(name="flat")(x)
    outputs = keras.layers.Dense(10, name="logits")(x)
    model = keras.Model(inputs, outputs, name="conv_outlier")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(digits.x_train, digits.y_train, epochs=15, batch_size=32, verbose=0)
    conv, mid = model.get_layer("conv"), model.get_layer("mid")
    kernel, bias = conv.get_weights()
    activations = np.maximum(np.asarray(conv(digits.x_train)), 0)
    unit = int(np.argmax(activations.mean(axis=(0, 1, 2))))  # an active channel: calibration sees its outlier
    kernel[..., unit] *= OUTLIER
    bias[unit] *= OUTLIER
    conv.set_weights([kernel, bias])
    mid_kernel, mid_bias = mid.get_weights()
    mid_kernel[:, :, unit, :] /= OUTLIER  # kernel [3, 3, in, out]: the input channel that carries the outlier
    mid.set_weights([mid_kernel, mid_bias])
    path = tmp_path_factory.mktemp("conv-outlier") / "conv_outlier2.keras"
    model.save(path)
    return path


def _accuracy(path: Path, digits: Any) -> float:
    from toolkit.runtimes.execution.tflite import TFLiteSession

    session = TFLiteSession(path)
    try:
        name = session.inputs[0].name  # the session quantizes float data for an int8 input itself
        predictions = [int(np.argmax(session.run({name: x[None]})[0])) for x in digits.x_heldout]
    finally:
        session.close()
    return float(np.mean(np.array(predictions) == digits.y_heldout))


# --------------------------------------------------------------------------------------------- the table


def test_healthy_logits_layer_is_not_ranked_lost(digits, digits_source, tmp_path) -> None:
    """The trained digits CNN quantizes well: no layer of its table may look lost. The debugger built from a
    converter read the float copy of the last layer before the softmax after ``invoke()``, from an arena a later
    op had reused (zeros in its first elements): that healthy logits layer ranked first with channel error 1.0
    while the debugger's own RMSE/scale for it was 0.30."""
    from toolkit.conversion.tflite import table as layers

    start = time.perf_counter()
    table = layers.tflite_table(digits_request(digits_source, digits, tmp_path, precision="int8", io_dtype="int8"))
    print(f"table in {time.perf_counter() - start:.1f}s:", [(r.op_type, round(r.channel_error, 4)) for r in table.rows])
    # the logits layer: the dense layer without a fused ReLU (Keras numbers layer names per process)
    logits = [r for r in table.rows if r.op_type == "FULLY_CONNECTED" and "Relu" not in r.name]
    assert len(logits) == 1, table.rows
    measured = [r for r in table.rows if not np.isnan(r.channel_error)]
    assert len(measured) >= 5  # two convolutions, two dense layers, the softmax at least
    assert max(r.channel_error for r in measured) < 0.05, table.rows
    # both measures agree that the logits layer is healthy: a fraction of one quantization step
    assert logits[0].rmse_range * layers.INT8_LEVELS < 0.5


def test_table_puts_the_outlier_layer_first(conv_outlier_keras, digits, tmp_path) -> None:
    from toolkit.conversion.tflite import table as layers
    from toolkit.sources import open_source

    request = digits_request(open_source(str(conv_outlier_keras)), digits, tmp_path, precision="int8", io_dtype="int8")
    table = layers.tflite_table(request)
    worst = table.rows[0]
    assert worst.op_type == "CONV_2D" and "/conv_" in worst.name, table.rows
    assert worst.channel_error > 0.5  # the seven normal channels are lost
    # keeping it float takes its consumer too: mid would re-quantize its output with the same range
    assert len(worst.float_group) == 2 and "/mid_" in worst.float_group[1], worst.float_group


# --------------------------------------------------------------------------------------------- int8 I/O


def _dtypes(path: Path) -> tuple[list[str], list[str]]:
    from toolkit.runtimes.inspection.tflite import inspect_tflite

    info = inspect_tflite(path)
    return [t.dtype for t in info.inputs], [t.dtype for t in info.outputs]


def test_float_island_at_the_borders_keeps_int8_io(conv_outlier_keras, digits, tmp_path) -> None:
    """The worst layer reads the input and (the logits layer, the one FULLY_CONNECTED) the last layer writes the output: the selective
    artifact still has int8 input and output (a DEQUANTIZE after the input, a QUANTIZE before the output, with
    the scales the calibration measured) and its accuracy is back where full INT8 lost it."""
    from toolkit.conversion.tflite import table as layers
    from toolkit.conversion.tflite import convert as tflite
    from toolkit.runtimes.inspection.tflite import inspect_tflite
    from toolkit.sources import open_source

    source = open_source(str(conv_outlier_keras))
    plain_request = digits_request(source, digits, tmp_path / "w", precision="int8", io_dtype="int8")
    start = time.perf_counter()
    plain = tflite.convert(plain_request, tmp_path / "plain.tflite")
    plain_s = time.perf_counter() - start
    import keras

    model = keras.saving.load_model(conv_outlier_keras, compile=False)
    float_acc = float(np.mean(np.argmax(model.predict(digits.x_heldout, verbose=0), 1) == digits.y_heldout))
    plain_acc = _accuracy(plain.path, digits)
    group = layers.tflite_table(plain_request).rows[0].float_group
    figures = {"float": float_acc, "plain int8": plain_acc, "plain s": plain_s}
    for label, nodes in (("input border", group), ("both borders", (*group, "FULLY_CONNECTED"))):
        request = digits_request(source, digits, tmp_path / "w", precision="int8", io_dtype="int8",
                                 nodes_to_exclude=nodes)
        start = time.perf_counter()
        built = tflite.convert(request, tmp_path / f"{label}.tflite")
        figures[f"{label} s"] = time.perf_counter() - start
        figures[label] = accuracy = _accuracy(built.path, digits)
        assert _dtypes(built.path) == (["int8"], ["int8"]), label
        assert built.float_io == (), built.float_io
        ops = inspect_tflite(built.path).op_counts
        assert ops.get("DEQUANTIZE", 0) >= 1 and ops.get("QUANTIZE", 0) >= 1, ops  # the island's borders
        assert accuracy >= float_acc - 0.01, (label, accuracy, float_acc)
    print(figures)
    assert plain_acc < float_acc - 0.5  # what the selective artifacts repair
    both = inspect_tflite(tmp_path / "both borders.tflite")
    assert both.outputs[0].quantization is not None and both.inputs[0].quantization is not None


# --------------------------------------------------------------------------------------------- one calibration


def _qparams(path: Path) -> tuple[list[tuple[str, int, tuple[int, ...]]], np.ndarray]:
    """(tensor name, type, zero points) of every tensor of the main graph, and all their scales in order."""
    from tensorflow.lite.python import util as tf_util

    graph = tf_util._convert_model_from_bytearray_to_object(path.read_bytes()).subgraphs[0]
    rows, scales = [], []
    for tensor in graph.tensors:
        q = tensor.quantization
        quantized = q is not None and q.scale is not None
        rows.append((tensor.name.decode(), int(tensor.type), tuple(int(z) for z in q.zeroPoint) if quantized else ()))
        scales += [float(s) for s in q.scale] if quantized else []
    return rows, np.array(scales)


def test_one_calibration_serves_every_build_with_fresh_parameters(conv_outlier_keras, digits, tmp_path) -> None:
    """A run calibrates once: the full INT8 artifact quantized from that calibration has the quantization
    parameters of TFLiteConverter's own int8 conversion (which calibrates inside), and a selective rebuild from
    it those of a build that calibrates afresh (equal samples in new objects miss the cache)."""
    import dataclasses

    import tensorflow as tf

    from toolkit.conversion.tflite import convert as tflite
    from toolkit.sources import open_source

    plain = digits_request(open_source(str(conv_outlier_keras)), digits, tmp_path / "w", precision="int8",
                           io_dtype="int8")
    mixed = dataclasses.replace(plain, recipe=dataclasses.replace(plain.recipe, nodes_to_exclude=("conv", "mid")))
    tflite._CACHE.clear()
    built = tflite.convert(plain, tmp_path / "plain.tflite")
    assert len(tflite._CACHE) == 1
    calibrated = tflite._CACHE[0].model
    reused = tflite.convert(mixed, tmp_path / "reused.tflite")
    assert len(tflite._CACHE) == 1 and tflite.calibrated_model(mixed) is calibrated  # no second calibration

    converter = tf.lite.TFLiteConverter.from_saved_model(str(tflite.fixed_saved_model(plain)))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = tflite._representative(plain)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    reference = tmp_path / "converter.tflite"
    reference.write_bytes(converter.convert())

    fresh_request = dataclasses.replace(mixed, calibration=tuple(dict(feed) for feed in mixed.calibration))
    fresh = tflite.convert(fresh_request, tmp_path / "fresh.tflite")
    assert len(tflite._CACHE) == 2  # it calibrated again
    for ours, theirs in ((built.path, reference), (reused.path, fresh.path)):
        (rows, scales), (want_rows, want_scales) = _qparams(ours), _qparams(theirs)
        assert rows == want_rows, ours.name
        assert len(scales) > 10 and np.allclose(scales, want_scales, rtol=1e-6, atol=0), ours.name
    assert built.float_nodes == () and set(reused.float_nodes) == {"conv", "mid"}
