"""Small ONNX helpers shared by the ONNX quantizer (``onnx_quant``) and the fragile-pattern finder (``fragile``):
the ``onnx`` import with its install hint, saving a model, and running a model for chosen intermediate tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.errors import MissingDependency

if TYPE_CHECKING:
    import onnx

_TWO_GB = 2**31 - 2**20


def require_onnx() -> Any:
    """The ``onnx`` module, or the error naming the extra that brings it."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - the onnx extra is part of every test run
        raise MissingDependency("onnx", extra="onnx", purpose="Building ONNX artifacts") from exc
    return onnx


def save_model(model: onnx.ModelProto, path: Path, *, final_name: str) -> None:
    """Save with weights inside the file; only a model over protobuf's 2 GB limit gets a ``.data`` file."""
    onnx = require_onnx()
    if model.ByteSize() < _TWO_GB:
        onnx.save_model(model, str(path))
    else:  # pragma: no cover - no test model is 2 GB
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{final_name}.data",
        )


def run_outputs(model: onnx.ModelProto, names: Sequence[str], scratch: Path, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """``names`` (float tensors of ``model``) over ``feeds``, shapes kept, graph optimizations off so the
    Q/DQ pairs are not folded away."""
    import onnxruntime as ort

    onnx = require_onnx()
    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    present = {o.name for o in augmented.graph.output}
    for name in names:
        if name not in present:
            augmented.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    path = scratch / "augmented.onnx"
    save_model(augmented, path, final_name=path.name)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    wanted = list(names)
    result: dict[str, list[np.ndarray]] = {n: [] for n in wanted}
    for feed in feeds:
        for name, value in zip(wanted, session.run(wanted, dict(feed))):
            result[name].append(np.asarray(value))
    return result
