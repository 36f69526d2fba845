"""The TFLite quantization debugger on a Keras / SavedModel source, from the run's one calibration: what the
layer table of the TFLite route (``layers.tflite_table``) reads: each op output's per-channel error and error in
quantization steps (``debug_run``), and the op graph that gives each layer its float group (``op_graph``)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from toolkit.compat import tensorflow as tf_compat
from toolkit.conversion.base import ConversionRequest, as_input_dtype
from toolkit.conversion.sensitivity import ChannelError
from toolkit.conversion.tflite.convert import calibrated_model, import_tf, tf_source
from toolkit.errors import ConversionError, key_line


def debug_run(request: ConversionRequest) -> tuple[bytes, dict[str, float], dict[str, float]]:
    """One TFLite quantization-debugger run: (calibrated model, per-channel error, error in steps) per op output
    tensor name. ``layer_direct_compare_metrics`` gets the float and quantized outputs but not the tensor's name;
    the debugger calls it in its ``layer_statistics`` key order for every sample, which maps calls to names.

    The debugger is given the instrumented model (``quant_debug_model_content``), not the converter: built from a
    converter it opens its interpreter without ``experimental_preserve_all_tensors`` and reads the tensors after
    ``invoke()`` from an arena later ops have reused (the float copy of the last layer read back zeros, so a
    healthy logits layer ranked first with channel error 1.0). Its own NumericVerify differences were right."""
    tf = import_tf()
    from tensorflow.lite.python import convert as tf_convert

    from toolkit.conversion.sensitivity import DEBUG_SAMPLES

    calibrated = calibrated_model(request)
    source = tf_source(request)
    samples = list(request.calibration[:DEBUG_SAMPLES])
    holder: dict[str, object] = {}  # the QuantizationDebugger, passed on
    calls: list[ChannelError] = []

    def channel_error(floats: np.ndarray, quants: np.ndarray, scale: float, zero_point: int) -> float:
        stats = ChannelError(axis=-1)
        values = np.asarray(quants)
        if np.issubdtype(values.dtype, np.integer):
            values = (values.astype(np.float64) - float(zero_point)) * float(scale)
        stats.add(floats, values)
        calls.append(stats)
        return 0.0

    def debug_dataset() -> Iterator[list[np.ndarray]]:
        # The debugger feeds lists in its interpreter's input order (tensor names such as
        # ``serving_default_image:0``); map them back to the source's input names.
        details = tf_compat.debugger_interpreter(holder["debugger"]).get_input_details()
        order = [_match_input(str(d["name"]), [s.name for s in source.inputs]) for d in details]
        dtypes = {s.name: s.dtype for s in source.inputs}
        for feed in samples:
            yield [as_input_dtype(feed[name], dtypes[name]) for name in order]

    try:
        instrumented = tf_convert.mlir_quantize(
            calibrated,
            disable_per_channel=not request.recipe.per_channel,
            fully_quantize=False,
            enable_numeric_verify=True,
        )
        options = tf.lite.experimental.QuantizationDebugOptions(
            layer_direct_compare_metrics={"channel_error": channel_error}
        )
        debugger = holder["debugger"] = tf.lite.experimental.QuantizationDebugger(
            quant_debug_model_content=bytes(instrumented), debug_dataset=debug_dataset, debug_options=options
        )
        debugger.run()
        buffer = io.StringIO()
        debugger.layer_statistics_dump(buffer)
    except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(f"The TFLite quantization debugger failed: {key_line(exc)}") from None
    rows = list(csv.DictReader(io.StringIO(buffer.getvalue())))
    names = [row.get("tensor_name", "") for row in rows]  # the dump follows ``layer_statistics`` order
    channel = _channel_errors(calls, names) if names and len(calls) == len(names) * len(samples) else {}
    return calibrated, channel, _step_errors(rows)


def _channel_errors(calls: Sequence[ChannelError], names: Sequence[str]) -> dict[str, float]:
    """Tensor name -> per-channel error, from the debugger's calls (``names`` in call order, once per sample)."""
    merged = {name: ChannelError(axis=-1) for name in names}
    for index, stats in enumerate(calls):
        target = merged[names[index % len(names)]]
        if stats.signal is None or stats.noise is None:
            target.bad_shape = True
        elif target.signal is None or target.noise is None:
            target.signal, target.noise, target.samples = stats.signal, stats.noise, 1
        elif target.signal.shape == stats.signal.shape:
            target.signal, target.noise = target.signal + stats.signal, target.noise + stats.noise
        else:
            target.bad_shape = True
    return {name: stats.score() for name, stats in merged.items()}


def _step_errors(rows: Sequence[Mapping[str, str]]) -> dict[str, float]:
    """Tensor name -> the debugger's RMS error in quantization steps (RMSE / scale), from its statistics dump."""
    steps: dict[str, float] = {}
    for row in rows:
        try:
            mse = float(row["mean_squared_error"])
            scale = float(row["scale"])
        except (KeyError, ValueError):
            continue
        score = math.sqrt(max(mse, 0.0)) / scale if scale > 0 else float("inf")
        steps[row["tensor_name"]] = float("inf") if math.isnan(score) else score
    return steps


def op_graph(model: bytes) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """(builtin op name, first output tensor name) of each op of the main graph, and which ops read each
    op's outputs (op name -> consumer op names, by first output tensor name)."""
    from toolkit.conversion.tflite import fragile as fragile_tflite

    ops = [(kind, ins, outs) for kind, ins, outs in fragile_tflite.tflite_graph(model).ops if outs]
    producer = {out: outs[0] for _kind, _ins, outs in ops for out in outs}
    consumers: dict[str, list[str]] = {}
    for _kind, ins, outs in ops:
        for tensor in ins:
            source = producer.get(tensor)
            if source is not None and outs[0] not in consumers.setdefault(source, []):
                consumers[source].append(outs[0])
    return [(kind, outs[0]) for kind, _ins, outs in ops], consumers


# Ops that move or select values without computing new ones (sensitivity.float_group follows them).
PASSTHROUGH = {
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "MAX_POOL_2D", "CONCATENATION", "PAD", "PADV2",
    "STRIDED_SLICE", "SLICE", "GATHER", "SPLIT", "SPLIT_V", "PACK", "UNPACK", "RELU", "RELU6", "DEPTH_TO_SPACE",
    "SPACE_TO_DEPTH", "RESIZE_NEAREST_NEIGHBOR",
}


def _match_input(tensor_name: str, names: Sequence[str]) -> str:
    """``serving_default_image:0`` -> ``image`` (the longest source input name it contains)."""
    base = tensor_name.split(":")[0]
    for name in sorted(names, key=len, reverse=True):
        if base == name or base.endswith(f"_{name}"):
            return name
    if len(names) == 1:
        return names[0]
    raise ConversionError(f"Cannot tell which input the TFLite tensor {tensor_name!r} is.")