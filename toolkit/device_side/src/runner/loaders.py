"""The loader table: one row per runtime, the runtime's name in RUNTIME_ROWS (toolkit/device_side/shared.py, which
the host reads too) and the loader class its block defines. A new runtime is its block (a Loader subclass, its
block line in src/edgetk_runner.py) and its row here; no other block branches on a runtime's or a format's
name (tests/runner/test_blocks.py).
"""
from typing import Dict, Type  # noqa: F401
from shared import RUNTIME_ROWS
from .executorch import ExecuTorchLoader
from .litert import LiteRTLoader
from .models import LOADERS, Loader
from .onnxruntime import OnnxRuntimeLoader
from .tensorflow import TensorFlowLoader
from .tflite_runtime import TFLiteRuntimeLoader

# --- shipped from here (the lines above are for the host's type checker) ---


LOADER_CLASSES = {
    "litert": LiteRTLoader,
    "tflite-runtime": TFLiteRuntimeLoader,
    "tensorflow": TensorFlowLoader,
    "onnxruntime": OnnxRuntimeLoader,
    "executorch": ExecuTorchLoader,
}  # type: Dict[str, Type[Loader]]
# into the table the models block owns (LOADERS), in RUNTIME_ROWS' order, the order the runner tries them for a
# format; a row without a loader is left out
LOADERS.extend(LOADER_CLASSES[row["runtime"]](row) for row in RUNTIME_ROWS if row["runtime"] in LOADER_CLASSES)
