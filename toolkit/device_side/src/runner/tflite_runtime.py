"""tflite-runtime: the TFLite runtime of older images (built for numpy 1.x: it fails to import under numpy 2, which
the load error classifier names).
"""
from typing import Any  # noqa: F401
from .tflite import TFLiteLoader

# --- shipped from here (the lines above are for the host's type checker) ---


class TFLiteRuntimeLoader(TFLiteLoader):
    """tflite-runtime's Interpreter, tried after LiteRT's."""

    def interpreter_class(self):
        # type: () -> Any
        from tflite_runtime.interpreter import Interpreter

        return Interpreter

    def delegate_loader(self):
        # type: () -> Any
        from tflite_runtime.interpreter import load_delegate

        return load_delegate
