"""Small ONNX helpers shared by the ONNX stages and ``fragile``: the ``onnx`` import with its install hint, opsets,
graph maps, saving (staged beside the final path), a quiet onnxruntime session, and intermediate tensors.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.errors import MissingDependency

if TYPE_CHECKING:
    import onnx

    from toolkit.conversion.base import ConversionRequest

_TWO_GB = 2**31 - 2**20


def require_onnx() -> ModuleType:
    """The ``onnx`` module, or the error naming the extra that brings it (Any: a module object)."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - the onnx extra is part of every test run
        raise MissingDependency("onnx", extra="onnx", purpose="Building ONNX artifacts") from exc
    return onnx


def export_opset(request: ConversionRequest, default: int) -> int:
    """The opset an exporter writes: the recipe's, else ``default``, never above the target's ``max_opset``."""
    opset = request.recipe.opset or default
    return opset if request.max_opset is None else min(opset, request.max_opset)


def opset_of(model: onnx.ModelProto | Path) -> int:
    """The ai.onnx opset of a model or a model file (0 when it names none)."""
    proto: onnx.ModelProto = require_onnx().load(str(model), load_external_data=False) if isinstance(model, Path) else model
    return next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def graph_maps(nodes: Iterable[onnx.NodeProto]) -> tuple[dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]]]:
    """(the node that writes each tensor, the nodes that read each tensor) of ``nodes``."""
    producers: dict[str, onnx.NodeProto] = {}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        producers.update((out, node) for out in node.output)
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return producers, readers


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


@contextlib.contextmanager
def staged_file(output: Path) -> Iterator[Path]:
    """A temporary path beside ``output``; renamed onto ``output`` only if the block finishes."""
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{output.stem}.", suffix=".partial.onnx", dir=output.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)


def refused_copy(output: Path) -> Path:
    """Where an artifact onnxruntime refused is kept beside ``output`` (never a shipped name), to read its nodes."""
    return output.with_suffix(".refused.onnx")


def session(path: Path, *, optimize: bool = True) -> Any:  # Any: onnxruntime is untyped
    """A quiet onnxruntime CPU session (Any: onnxruntime is untyped); ``optimize=False`` keeps every node
    (graph optimizations would fold the Q/DQ pairs away)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """onnxruntime.quantization logs warnings on the root logger and via warnings, and drops debug files
    into the working directory: keep stderr readable and the user's directory clean."""
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="edgetk-ort-") as scratch:
            warnings.simplefilter("ignore")
            # symbolic shape inference dumps sym_shape_infer_temp.onnx + a .data file into the cwd on failure
            with contextlib.chdir(scratch):
                yield
    finally:
        root.setLevel(level)


def run_outputs(model: onnx.ModelProto, names: Sequence[str], scratch: Path, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """``names`` (float tensors of ``model``) over ``feeds``, shapes kept, graph optimizations off so the
    Q/DQ pairs are not folded away."""
    onnx = require_onnx()
    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    present = {o.name for o in augmented.graph.output}
    for name in names:
        if name not in present:
            augmented.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    path = scratch / "augmented.onnx"
    save_model(augmented, path, final_name=path.name)
    runner = session(path, optimize=False)
    wanted = list(names)
    result: dict[str, list[np.ndarray]] = {n: [] for n in wanted}
    for feed in feeds:
        for name, value in zip(wanted, runner.run(wanted, dict(feed))):
            result[name].append(np.asarray(value))
    return result
