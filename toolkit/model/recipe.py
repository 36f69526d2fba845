"""A recipe: how to build one artifact (format, precision and the knobs that decide whether it is fast)."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.errors import UsageError
from toolkit.model.platform import EXECUTION_PROVIDERS
from toolkit.model.records import Record
from toolkit.model.schemas.problems import did_you_mean
from toolkit.model.vocabulary import (
    CalibrationMethod,
    Format,
    IoDtype,
    Layout,
    Precision,
    QuantFormat,
    QuantType,
)


class RecipeError(UsageError):
    """A recipe refused by :class:`Recipe`; ``key`` is the field at fault, so a profile loader can name it
    without reading the message."""

    fix = (
        "Fix the named field of the recipe in your target profile; `edgetk targets show NAME` prints the "
        "resolved profile."
    )

    def __init__(self, key: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key = key


@dataclass(frozen=True)
class Recipe(Record):
    """How to build one artifact: format and precision, plus the knobs that decide whether it is fast.

    Target profiles list recipes in order of preference; ``--precision``/``--format`` build plain ones.
    ``__post_init__`` refuses a recipe its format cannot express, so a wrong one never reaches a converter.
    """

    format: Format
    precision: Precision
    io_dtype: IoDtype = IoDtype.FLOAT32  # TFLite int8: the input/output type ("int8" for int8 recipes)
    activation_type: QuantType = QuantType.UINT8  # ONNX static int8: U8S8 2x faster than S8S8 on x86
    weight_type: QuantType = QuantType.INT8
    calibration_method: CalibrationMethod = CalibrationMethod.MINMAX
    per_channel: bool = True
    quant_format: QuantFormat = QuantFormat.QDQ
    # ONNX static int8, 8-bit activations: 7-bit weights, so that U8S8 kernels on x86 without VNNI cannot saturate.
    # None: the toolkit decides by the target's CPU (toolkit.conversion.onnx.saturation).
    reduce_range: bool | None = None
    threads: int | None = None
    opset: int | None = None
    nodes_to_exclude: tuple[str, ...] = ()  # selective quantization: kept in float
    execution_providers: tuple[str, ...] = ()  # ONNX Runtime providers for the device, in order
    layout: Layout | None = None  # NHWC to ask a PyTorch -> TFLite route for channel-last I/O

    def __post_init__(self) -> None:
        if self.io_dtype != IoDtype.FLOAT32 and not (self.format == Format.TFLITE and self.precision == Precision.INT8):
            raise RecipeError(
                "io_dtype",
                f"io_dtype {self.io_dtype!r} needs a full-integer TFLite recipe (got {self.format} {self.precision}).",
                hint="Only TFLite int8 artifacts take integer input/output; leave io_dtype at float32.",
            )
        if self.activation_type == QuantType.INT16 or self.weight_type == QuantType.INT16:
            self._check_a16w8()
        if self.reduce_range is not None and not (
                self.format == Format.ONNX and self.precision == Precision.INT8 and not self.a16w8):
            raise RecipeError("reduce_range", "reduce_range applies to ONNX int8 recipes with 8-bit activations "
                              f"(got {self.brief}).", hint="Leave reduce_range out of this recipe.")
        if self.threads is not None and self.threads < 1:
            raise RecipeError("threads", f"threads must be at least 1 (got {self.threads}).")
        for provider in self.execution_providers:
            if provider not in EXECUTION_PROVIDERS:
                raise RecipeError("execution_providers", f"unknown execution provider {provider!r}"
                                  f"{did_you_mean(provider, EXECUTION_PROVIDERS)}.",
                                  hint=f"Use one of: {', '.join(EXECUTION_PROVIDERS)}.")

    def _check_a16w8(self) -> None:
        """int16 is the activation type of the A16W8 recipe only: an int8 recipe with int8 weights, QDQ in ONNX
        (ONNX Runtime's only 16-bit format), float I/O in TFLite (the 16x8 converter's inputs stay float)."""
        hint = ('For A16W8 write precision = "int8", activation_type = "int16", weight_type = "int8" '
                '(quant_format = "qdq" in ONNX, io_dtype = "float32" in TFLite).')
        if self.weight_type == QuantType.INT16:
            raise RecipeError("weight_type", "weight_type 'int16' is not offered: 16 bits are for activations "
                              "(A16W8).", hint=hint)
        if self.precision != Precision.INT8:
            raise RecipeError("activation_type", f"activation_type 'int16' needs precision int8 (got "
                              f"{self.precision}).", hint=hint)
        if self.weight_type != QuantType.INT8:
            raise RecipeError("weight_type", f"A16W8 takes int8 weights (got {self.weight_type}).", hint=hint)
        if self.format == Format.ONNX and self.quant_format != QuantFormat.QDQ:
            raise RecipeError("quant_format", "16-bit activations exist in ONNX Runtime only as QDQ (got "
                              f"{self.quant_format}).", hint=hint)
        if self.format == Format.TFLITE and self.io_dtype != IoDtype.FLOAT32:
            raise RecipeError("io_dtype", f"A16W8 TFLite takes float32 input/output (got {self.io_dtype}).",
                              hint=hint)

    @property
    def a16w8(self) -> bool:
        """16-bit activations, 8-bit weights: the accuracy fallback after plain INT8 (never preferred to it)."""
        return self.precision == Precision.INT8 and self.activation_type == QuantType.INT16

    @property
    def brief(self) -> str:
        """``onnx int8``, ``tflite int8 A16W8``: what a list of attempts names a recipe by."""
        return f"{self.format} {self.precision}" + (" A16W8" if self.a16w8 else "")

    @property
    def label(self) -> str:
        """A short human name: ``tflite int8 (int8 io)``, ``onnx int8 (U8S8 qdq minmax)``, ``onnx int8 (U8S8 qdq minmax
        reduce_range)``, ``onnx int8 (A16W8 qdq minmax)``, ``tflite int8 (A16W8, float32 io)``."""
        if self.precision != Precision.INT8:
            return f"{self.format} {self.precision}"
        if self.format == Format.TFLITE:
            return f"tflite int8 ({'A16W8, ' if self.a16w8 else ''}{self.io_dtype} io)"
        if self.format == Format.PTE:
            return f"pte int8 (XNNPACK, {'per-channel' if self.per_channel else 'per-tensor'} weights)"
        if self.a16w8:
            return f"onnx int8 (A16W8 {self.quant_format} {self.calibration_method})"
        act = "U" if self.activation_type == QuantType.UINT8 else "S"
        wt = "U" if self.weight_type == QuantType.UINT8 else "S"
        return (f"onnx int8 ({act}8{wt}8 {self.quant_format} {self.calibration_method}"
                + (" reduce_range)" if self.reduce_range else ")"))
