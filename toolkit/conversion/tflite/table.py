"""The layer table of the Keras/SavedModel -> TFLite route: one ``QuantizationDebugger`` run
(``debugger.debug_run``); each op runs next to a float copy fed the same dequantized input, so a row is that op's
*own* error. ``rmse_range`` is the debugger's RMSE over the quantized range (``255 * scale``: the tutorial's
``rmse/scale`` / 255).
"""

from __future__ import annotations

import math

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.layers import INT8_LEVELS, LayerTable, ranked
from toolkit.conversion.sensitivity import Row
from toolkit.model.vocabulary import Format


def tflite_table(request: ConversionRequest, full: BuiltArtifact | None = None) -> LayerTable:
    """The table of a Keras/SavedModel -> TFLite INT8 recipe (one quantization-debugger run, which quantizes
    anew: ``full`` is not read)."""
    from toolkit.conversion.tflite import debugger as tflite_debugger
    from toolkit.conversion.sensitivity import DEBUG_SAMPLES, float_group

    calibrated, channel, steps = tflite_debugger.debug_run(request)
    ops, consumers = tflite_debugger.op_graph(calibrated)
    kinds = {name: kind for kind, name in ops}
    position = {name: index for index, (_kind, name) in enumerate(ops)}  # execution order

    def op_of(tensor: str) -> str:
        if tensor in kinds:
            return tensor
        prefixed = [n for n in kinds if tensor.startswith(n) and tensor[len(n):].isdigit()]
        return max(prefixed, key=len) if prefixed else ""

    names = sorted(dict.fromkeys([*channel, *steps]), key=lambda n: position.get(op_of(n), len(position)))
    def group(name: str) -> tuple[str, ...]:
        op = op_of(name)
        return float_group(op, consumers, lambda o: kinds.get(o) in tflite_debugger.PASSTHROUGH) if op else (name,)

    rows: list[Row] = [(name, kinds.get(op_of(name), ""), channel.get(name, math.nan),
                        steps.get(name, math.nan) / INT8_LEVELS, None, group(name)) for name in names]
    return LayerTable(
        route=Format.TFLITE,
        method="TFLite QuantizationDebugger: each op's int8 output vs its float copy fed the same input",
        samples=min(DEBUG_SAMPLES, len(request.calibration)), rows=ranked(rows),
    )
