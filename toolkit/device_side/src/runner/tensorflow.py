"""TensorFlow's tf.lite: the TFLite runtime of last resort (a device with the whole of TensorFlow installed).
"""
from typing import Any  # noqa: F401
from .tflite import TFLiteLoader

# --- shipped from here (the lines above are for the host's type checker) ---


class TensorFlowLoader(TFLiteLoader):
    """tf.lite's Interpreter, tried after LiteRT and tflite-runtime."""

    def interpreter_class(self):
        # type: () -> Any
        import tensorflow as tf

        return tf.lite.Interpreter

    def delegate_loader(self):
        # type: () -> Any
        import tensorflow as tf

        return tf.lite.experimental.load_delegate
