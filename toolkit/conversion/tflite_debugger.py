"""The TFLite quantization debugger on a Keras / SavedModel source, from the run's one calibration: the TFLite
side of ``sensitivity`` (``layer_errors`` ranks layers, ``float_groups`` orders groups to keep in float)."""

from __future__ import annotations

import csv
import io
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.conversion.base import ConversionRequest, as_input_dtype
from toolkit.conversion.sensitivity import ChannelError
from toolkit.conversion.tflite import _calibrated, _source, _tf
from toolkit.errors import ConversionError, key_line


def debug_run(request: ConversionRequest) -> tuple[bytes, dict[str, float], dict[str, float]]:
    """One TFLite quantization-debugger run: (calibrated model, per-channel error, error in steps) per op output
    tensor name. ``layer_direct_compare_metrics`` gets the float and quantized outputs but not the tensor's name;
    the debugger calls it in its ``layer_statistics`` key order for every sample, which maps calls to names.

    The debugger is given the instrumented model (``quant_debug_model_content``), not the converter: built from a
    converter it opens its interpreter without ``experimental_preserve_all_tensors`` and reads the tensors after
    ``invoke()`` from an arena later ops have reused (the float copy of the last layer read back zeros, so a
    healthy logits layer ranked first with channel error 1.0). Its own NumericVerify differences were right."""
    tf = _tf()
    from tensorflow.lite.python import convert as tf_convert

    from toolkit.conversion.sensitivity import DEBUG_SAMPLES

    calibrated = _calibrated(request)
    source = _source(request)
    samples = list(request.calibration[:DEBUG_SAMPLES])
    holder: dict[str, Any] = {}  # Any: the QuantizationDebugger (tensorflow is untyped)
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
        details = holder["debugger"]._quant_interpreter.get_input_details()
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


def _ranked(scores: dict[str, float]) -> list[tuple[str, float]]:
    rows = [(name, score) for name, score in scores.items() if not math.isnan(score)]
    rows.sort(key=lambda item: item[1], reverse=True)
    return rows


def layer_errors(request: ConversionRequest, *, limit: int) -> list[tuple[str, float]]:
    """Per-layer int8 error, worst first: (op output tensor name, ``sensitivity.ChannelError`` of its quantized output
    against its float copy); the debugger's own RMSE / scale hides the layers that hurt most, so it does not rank."""
    _model, channel, steps = debug_run(request)
    return _ranked(channel or steps)[:limit]


def op_graph(model: bytes) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """(builtin op name, first output tensor name) of each op of the main graph, and which ops read each
    op's outputs (op name -> consumer op names, by first output tensor name)."""
    from toolkit.conversion import fragile_tflite

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


def float_groups(request: ConversionRequest, *, limit: int) -> list[tuple[tuple[str, ...], float]]:
    """The groups of ops worth keeping in float, best first: (op output tensor names, output error). Shortlists
    ``sensitivity.MAX_CULPRITS`` ops by per-channel error and error in steps, builds each alone and with its
    consumers float from one calibration, ordered by output error on ``sensitivity.SENSITIVITY_SAMPLES`` samples."""
    from tensorflow.lite.python import convert as tf_convert

    from toolkit.conversion import sensitivity
    from toolkit.runtimes.execution.tflite import TFLiteSession

    calibrated, channel, steps = debug_run(request)
    ops, consumers = op_graph(calibrated)
    kinds = {name: kind for kind, name in ops}

    def op_of(tensor: str) -> str | None:
        if tensor in kinds:
            return tensor
        prefixed = [n for n in kinds if tensor.startswith(n) and tensor[len(n) :].isdigit()]
        return max(prefixed, key=len) if prefixed else None

    def named(ranking: list[tuple[str, float]]) -> list[tuple[str, float]]:
        return [(op, score) for name, score in ranking if (op := op_of(name)) is not None]

    culprits = sensitivity.shortlist(named(_ranked(channel)), named(_ranked(steps)))
    groups = {
        name: sensitivity.float_group(name, consumers, lambda op: kinds.get(op) in PASSTHROUGH)
        for name in culprits
    }
    source = _source(request)
    samples = list(request.calibration[: sensitivity.SENSITIVITY_SAMPLES])
    feeds = [{s.name: as_input_dtype(feed[s.name], s.dtype) for s in source.inputs} for feed in samples]
    reference = [[np.asarray(o) for o in source.predict(feed)] for feed in feeds]
    measured: dict[tuple[str, ...], float] = {}
    for group in sensitivity.candidates(culprits, groups):
        try:
            model = tf_convert.mlir_quantize(
                calibrated,
                disable_per_channel=not request.recipe.per_channel,
                fully_quantize=False,
                denylisted_nodes=list(group),
            )
        except Exception:  # noqa: BLE001, S112 (a group the quantizer cannot split is simply not a candidate)
            continue
        fd, name = tempfile.mkstemp(suffix=".tflite", dir=request.workdir)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(bytes(model))
            session = TFLiteSession(Path(name))
            try:
                outputs = [[np.asarray(o) for o in session.run(feed)] for feed in feeds]
            finally:
                session.close()
        except Exception:  # noqa: BLE001, S112 (a candidate that does not run is not a candidate)
            continue
        finally:
            os.unlink(name)
        measured[group] = sensitivity.output_error(reference, outputs)
    return sensitivity.order(measured, limit=limit)


def _match_input(tensor_name: str, names: Sequence[str]) -> str:
    """``serving_default_image:0`` -> ``image`` (the longest source input name it contains)."""
    base = tensor_name.split(":")[0]
    for name in sorted(names, key=len, reverse=True):
        if base == name or base.endswith(f"_{name}"):
            return name
    if len(names) == 1:
        return names[0]
    raise ConversionError(f"Cannot tell which input the TFLite tensor {tensor_name!r} is.")