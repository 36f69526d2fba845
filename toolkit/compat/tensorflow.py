"""TensorFlow's private members that the TFLite route relies on (pinned: tensorflow==2.21.0, pyproject.toml).

- A .tflite flatbuffer read into its object form and written back (the border pass of ``conversion/
  tflite_borders``, the fragile-pattern graph of ``tflite.fragile``): TF's own reader and writer.
- The converter's two switches with no public name: calibrate only (the calibrated float model the quantizer and
  the debugger start from) and per-tensor instead of per-channel weights.
- The quantization debugger's quantized interpreter (its input order, ``conversion/tflite_debugger``).

TensorFlow is imported on first use, never by importing this module.
"""

from __future__ import annotations

from typing import Any

from toolkit.compat import Member

PIN = "tensorflow==2.21.0"

MEMBERS = (
    Member("tensorflow.lite.python.util", "_convert_model_from_bytearray_to_object"),
    Member("tensorflow.lite.python.util", "_convert_model_from_object_to_bytearray"),
    Member("tensorflow.lite.python.lite:TFLiteConverterBase", "_experimental_calibrate_only", instance=True),
    Member("tensorflow.lite.python.lite:TFLiteConverterBase", "_experimental_disable_per_channel", instance=True),
    Member("tensorflow.lite.tools.optimize.debugging.python.debugger:QuantizationDebugger", "_quant_interpreter",
           instance=True),
)


def model_object(model: bytes) -> Any:  # Any: the flatbuffer schema's ModelT (generated code)
    """A .tflite flatbuffer as its mutable object form (``ModelT``)."""
    from tensorflow.lite.python import util as tf_util

    return tf_util._convert_model_from_bytearray_to_object(model)


def model_bytes(model: object) -> bytes:
    """The object form (``ModelT``) written back as a .tflite flatbuffer."""
    from tensorflow.lite.python import util as tf_util

    return bytes(tf_util._convert_model_from_object_to_bytearray(model))


def calibrate_only(converter: object) -> None:
    """Make ``converter`` (a ``tf.lite.TFLiteConverter``) stop after calibration: the float model with the
    recorded tensor ranges."""
    setattr(converter, "_experimental_calibrate_only", True)


def per_tensor_weights(converter: object) -> None:
    """Make ``converter`` (a ``tf.lite.TFLiteConverter``) quantize weights per tensor instead of per channel."""
    setattr(converter, "_experimental_disable_per_channel", True)


def debugger_interpreter(debugger: object) -> Any:  # Any: TF's Interpreter (tensorflow is untyped)
    """The quantization debugger's (TF's ``QuantizationDebugger``) interpreter of the quantized model."""
    return getattr(debugger, "_quant_interpreter")
