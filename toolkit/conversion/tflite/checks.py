"""What a built int8 TFLite model must show before it is written: integer compute, the recipe's I/O type (or
I/O recorded as float, with why), and no op left float that nobody asked for without a note saying so."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from toolkit.errors import ConversionError
from toolkit.model.artifact import FloatIO
from toolkit.model.vocabulary import IoDtype


def unasked_float(path: Path, asked: Sequence[str]) -> list[str]:
    """A note naming the ops a mixed int8/float build left float without being asked (the MLIR quantizer in
    mixed mode keeps an op float where it has no int8 kernel, and the pass-through ops between float ops), so
    no op is float silently; none when every float op was asked for (by name or op type)."""
    from collections import Counter

    from toolkit.runtimes.inspection.tflite import float_ops

    wanted = set(asked)
    unasked = Counter(kind for kind, name in float_ops(path) if name not in wanted and kind not in wanted)
    if not unasked:
        return []
    kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(unasked.items()))
    return [f"also float without being asked ({sum(unasked.values())} op(s): no int8 kernel in the quantizer's "
            f"mixed mode, or between float ops): {kinds}"]


def check_int8(path: Path, *, io_dtype: IoDtype = IoDtype.FLOAT32, float_io: Sequence[FloatIO] = ()) -> None:
    from toolkit.runtimes.inspection.tflite import inspect_tflite

    info = inspect_tflite(path)
    if info.quantized_ops == 0:
        raise ConversionError(
            "int8 quantization changed nothing: the converted model has no operator computing in integer.",
            hint="The model's ops may have no int8 kernels; use fp16 or dynamic instead.",
        )
    # The quantizer silently leaves an I/O float next to a float op: an Edge TPU or an integer-only pipeline could
    # not feed it. ``int8_borders`` prevents that; an I/O still not ``io_dtype`` must be one it recorded, with why.
    recorded = {f.name for f in float_io}
    wrong = [f"{spec.name} is {spec.dtype}" for spec in (*info.inputs, *info.outputs)  # token ids stay integers
             if spec.dtype == "float32" and spec.name not in recorded]
    if io_dtype != IoDtype.FLOAT32 and wrong:
        raise ConversionError(
            f"The int8 model's I/O is not {io_dtype} as the recipe asks: {', '.join(wrong)} (a layer next to it "
            "is kept in float).",
            hint="Keep fewer layers next to the inputs/outputs in float, or use io_dtype float32.",
        )
