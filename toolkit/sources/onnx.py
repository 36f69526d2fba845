"""An ONNX file as a conversion source: I/O read from the graph, reference outputs from onnxruntime (CPU).

The original model is what every artifact is compared against, so ``predict`` runs it exactly as given (no
shape pinning, no opset upgrade): the convert stage's own changes must be measured, not assumed harmless.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.errors import MissingDependency, UsageError
from toolkit.sources.base import SourceModel
from toolkit.model.tensors import TensorSpec

if TYPE_CHECKING:
    import onnx


def load_onnx(path: Path, *, load_external_data: bool = True) -> onnx.ModelProto:
    """Parse ``path`` as an ONNX model; a file that is not one (truncated, corrupt, another format) is a
    :class:`UsageError` with a plain message rather than a protobuf traceback."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - the onnx extra is part of every test run
        raise MissingDependency("onnx", extra="onnx", purpose="Reading an ONNX model") from exc
    if not path.is_file():
        raise UsageError(f"{path} does not exist or is not a file.", hint="Pass the path of an .onnx file.")
    try:
        model = onnx.load(str(path), load_external_data=load_external_data)
    except FileNotFoundError as exc:
        raise UsageError(
            f"{path} refers to external weight data that is missing: {exc.filename or exc}.",
            hint="Keep the .onnx file and its external data file(s) in the same directory.",
        ) from exc
    except Exception as exc:  # protobuf DecodeError, UnicodeDecodeError, ValueError ...
        raise UsageError(
            f"{path} is not a readable ONNX model (truncated or corrupt: {_first_line(exc)}).",
            hint="Re-export or re-download the model file.",
        ) from exc
    if not model.HasField("graph") or not model.opset_import or len(model.graph.output) == 0:
        raise UsageError(
            f"{path} is not a complete ONNX model (no graph, opset or outputs; the file is probably truncated).",
            hint="Re-export or re-download the model file.",
        )
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


def _dims(value_info: Any) -> tuple[int | None, ...]:
    """A value_info's shape: ints where fixed, None for symbolic or unknown dimensions."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return ()
    return tuple(
        int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None
        for d in tensor_type.shape.dim
    )


def _dtype(value_info: Any) -> str:
    import onnx

    elem = value_info.type.tensor_type.elem_type
    if not elem:
        return "float32"
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)))


def tensor_specs(model: onnx.ModelProto) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Graph inputs (initializers excluded: old exporters list weights as inputs) and outputs."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(
        TensorSpec(vi.name, _dims(vi), _dtype(vi)) for vi in model.graph.input if vi.name not in initializers
    )
    outputs = tuple(TensorSpec(vi.name, _dims(vi), _dtype(vi)) for vi in model.graph.output)
    return inputs, outputs


class OnnxSource(SourceModel):
    """An ONNX model file. I/O come from the graph; ``predict`` runs the original file in onnxruntime."""

    framework = "onnx"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        model = load_onnx(self.path)
        self._inputs, self._outputs = tensor_specs(model)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        self._session: Any = None

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    def _open(self) -> Any:
        if self._session is None:
            try:
                import onnxruntime as ort
            except ImportError as exc:  # pragma: no cover
                raise MissingDependency("onnxruntime", extra="onnx", purpose="Running an ONNX model") from exc
            options = ort.SessionOptions()
            options.log_severity_level = 3
            try:
                self._session = ort.InferenceSession(
                    str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:
                raise UsageError(
                    f"onnxruntime cannot load {self.path}: {_first_line(exc)}",
                    hint="Check that the model is valid (onnx.checker) and uses operators onnxruntime supports.",
                ) from exc
        return self._session

    def predict(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        session = self._open()
        missing = [spec.name for spec in self._inputs if spec.name not in feeds]
        if missing:
            raise UsageError(f"No data for the model input(s) {', '.join(missing)}.")
        prepared = {
            spec.name: np.asarray(feeds[spec.name]).astype(spec.dtype, copy=False) for spec in self._inputs
        }
        try:
            return [np.asarray(out) for out in session.run(None, prepared)]
        except Exception as exc:
            shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in prepared.items())
            raise UsageError(
                f"The ONNX model {self.path.name} rejected inputs {shapes}: {_first_line(exc)}",
                hint="Check the input shapes (--input-shape NAME=D0,D1,...) and the calibration data layout.",
            ) from exc

    def close(self) -> None:
        self._session = None
