"""What the convert walk reads from a built ``.tflite`` file: its graph cut after each op (for the crash guard),
the ops a runtime's failure message names, and its layer tensors on held-out samples (for the layer probe)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.conversion.graph_cuts import Cuts
from toolkit.conversion.layers import LayerError

_VERSION = re.compile(r"\b([A-Z][A-Z0-9_]+) version \d+ \(")  # "DIV version 2 (...)": an op its runtime lacks
_NODE = re.compile(r"Node number (\d+) \(([A-Z][A-Z0-9_]+)\)")  # "Node number 7 (DIV) failed to invoke"


def named_ops(text: str) -> list[tuple[str, int | None]]:
    """(op type, node index or None) of each op a LiteRT / tflite-runtime message names."""
    return [(op, None) for op in _VERSION.findall(text)] + [(op, int(index)) for index, op in _NODE.findall(text)]


def cuts(path: Path) -> Cuts:
    """The main subgraph's operator list cut after each op, each cut named as LiteRT names a failing node
    (``Node number 3 (RESHAPE)``)."""
    from toolkit.runtimes.inspection import tflite as inspection

    schema = inspection.flatbuffer_schema()
    data = path.read_bytes()
    ops = inspection.main_graph_ops(path)
    return Cuts(len(ops), lambda k: _cut(schema, schema.ModelT.InitFromPackedBuf(data, 0), k),
                lambda k: f"Node number {k - 1} ({ops[k - 1]})")


def _cut(schema: Any, model: Any, ops: int) -> bytes:  # Any: generated schema objects
    """``model`` with its main graph's first ``ops`` ops only, the last op's outputs as the model's outputs."""
    import flatbuffers

    graph = model.subgraphs[0]
    graph.operators = graph.operators[:ops]
    graph.outputs = [int(t) for t in graph.operators[-1].outputs if t >= 0]
    for signature in model.signatureDefs or []:
        if signature.subgraphIndex == 0:
            signature.outputs = []
            for t in graph.outputs:
                entry = schema.TensorMapT()
                entry.name, entry.tensorIndex = f"cut_{t}", t
                signature.outputs.append(entry)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def tensors(path: Path, names: Sequence[str], feeds: Sequence[Mapping[str, np.ndarray]],
            input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """``names`` of the ``.tflite`` at ``path`` over ``feeds`` (dequantized to float, stacked per sample); absent
    names left out."""
    import warnings

    from ai_edge_litert.interpreter import Interpreter

    with warnings.catch_warnings():  # "intended for debugging purposes only": that is what it is for here
        warnings.simplefilter("ignore", UserWarning)
        interpreter = Interpreter(model_path=str(path), experimental_preserve_all_tensors=True)
    interpreter.allocate_tensors()
    details = {d["name"]: d for d in interpreter.get_tensor_details()}
    out: dict[str, list[np.ndarray]] = {n: [] for n in names if n in details}
    for feed in feeds:
        for detail, name in zip(interpreter.get_input_details(), input_names):
            value = np.asarray(feed[name], dtype=np.float32)
            scale, zero = detail["quantization"]
            if scale and np.dtype(detail["dtype"]).kind in "iu":
                info = np.iinfo(detail["dtype"])
                value = np.clip(np.round(value / scale + zero), info.min, info.max)
            interpreter.set_tensor(detail["index"], value.astype(detail["dtype"]).reshape(detail["shape"]))
        interpreter.invoke()
        for name in out:
            detail = details[name]
            raw = interpreter.get_tensor(detail["index"])
            scale, zero = detail["quantization"]
            out[name].append((raw.astype(np.float32) - zero) * scale if scale and raw.dtype.kind in "iu"
                             else raw.astype(np.float32))
    return {n: np.stack(v) for n, v in out.items() if v}


def graph_order(path: Path, rows: Sequence[LayerError]) -> list[tuple[LayerError, str]]:
    """(table row, tensor name) for the rows whose tensor the ``.tflite`` has, in the order its ops run."""
    from ai_edge_litert.interpreter import Interpreter

    from toolkit.compat import litert as litert_compat

    interpreter = Interpreter(model_path=str(path))
    index = {d["name"]: d["index"] for d in interpreter.get_tensor_details()}
    producer = {int(t): i for i, op in enumerate(litert_compat.ops_details(interpreter)) for t in op["outputs"]}
    found = [(producer[index[r.name]], r, r.name) for r in rows if index.get(r.name) in producer]
    return [(row, tensor) for _, row, tensor in sorted(found, key=lambda item: item[0])]
