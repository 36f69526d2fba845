"""Tell which framework a SOURCE is from its path and content, and open it with the right loader."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from toolkit.errors import UsageError
from toolkit.model.vocabulary import Framework
from toolkit.sources.base import SourceModel

_FACTORY = re.compile(r"^(?P<target>[^:]+):(?P<attr>[A-Za-z_][A-Za-z0-9_]*)$")

SUPPORTED = (
    "a Keras file (.keras, .h5), a SavedModel directory, an ONNX (.onnx) or TFLite (.tflite) file, "
    "TorchScript (.pt, .jit), an ExportedProgram (.pt2), or a factory path/to/file.py:make_model"
)


def detect_framework(source: str) -> Framework:
    """The framework ``source`` comes from, by its path and content."""
    factory = _FACTORY.match(source)
    if factory and not Path(source).exists():
        target = factory.group("target")
        if target.endswith(".py") or re.fullmatch(r"[A-Za-z_][\w.]*", target):
            return Framework.TORCH_FACTORY
    path = Path(source)
    if not path.exists():
        raise UsageError(f"The source {source!r} does not exist.", hint=f"Pass {SUPPORTED}.")
    if path.is_dir():
        if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
            return Framework.SAVEDMODEL
        raise UsageError(
            f"The directory {source!r} is not a SavedModel (no saved_model.pb inside).",
            hint="Pass the directory written by model.export() or tf.saved_model.save(), or a model file.",
        )
    suffix = path.suffix.lower()
    if suffix in (".keras", ".h5", ".hdf5"):
        return Framework.KERAS
    if suffix == ".onnx":
        return Framework.ONNX
    if suffix == ".tflite":
        return Framework.TFLITE
    if suffix == ".pt2":
        return Framework.EXPORTED_PROGRAM
    if suffix in (".pt", ".jit", ".pth", ".torchscript"):
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
            if any(n.endswith("/constants.pkl") or n.endswith("code/__torch__.py") or "/code/" in n for n in names):
                return Framework.TORCHSCRIPT
            if any(n.endswith("/serialized_exported_program.json") or "/models/" in n for n in names):
                return Framework.EXPORTED_PROGRAM
        raise UsageError(
            f"{source!r} is not a TorchScript or ExportedProgram file (a plain state dict or pickle cannot be "
            "converted on its own).",
            hint="Save the model with torch.jit.save / torch.export.save, or pass a factory "
            "path/to/file.py:make_model with --weights FILE.",
        )
    raise UsageError(f"Cannot tell what kind of model {source!r} is.", hint=f"Pass {SUPPORTED}.")


def open_source(source: str, *, weights: Path | None = None) -> SourceModel:
    """Load ``source`` with its framework's loader (heavy imports happen here, not at import time)."""
    framework = detect_framework(source)
    if framework in (Framework.KERAS, Framework.SAVEDMODEL):
        from toolkit.quiet import import_tensorflow_quietly
        from toolkit.sources.tensorflow import open_tensorflow

        import_tensorflow_quietly()

        return open_tensorflow(Path(source), framework)
    if framework == Framework.ONNX:
        from toolkit.sources.onnx import OnnxSource

        return OnnxSource(Path(source))
    if framework == Framework.TFLITE:
        from toolkit.sources.tflite import TFLiteSource

        return TFLiteSource(Path(source))
    from toolkit.sources.torch_open import open_torch

    return open_torch(source, framework, weights=weights)
