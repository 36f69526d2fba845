"""The layer probe written next to each INT8 artifact with a layer table, so a failed device check names the
first diverging layer (:mod:`toolkit.checks.divergence`). On the first golden samples the host keeps, per table
layer in graph order, the float values (float16, ``layers/<artifact>.float.npz``) and the INT8 artifact's own
error there (``layers/<artifact>.probe.json``, RMS error over the float range as ``rmse_range``); for ONNX also
a copy with those tensors as graph outputs (``layers/<artifact>.debug.onnx``).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.conversion.layers import LayerError, read_table
from toolkit.delivery.bundle import PROBE_SAMPLES, debug_name, float_name, probe_name, save_npz
from toolkit.verification.dense import range_error
from toolkit.model.vocabulary import Format

# --------------------------------------------------------------------------------------------- host tensors


def tensors(path: Path, fmt: str, names: Sequence[str], feeds: Sequence[Mapping[str, np.ndarray]],
            input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """``names`` of the artifact at ``path`` over ``feeds`` (float, stacked per sample); absent names left out."""
    if fmt == Format.ONNX:
        from toolkit.conversion.onnx.graph_io import require_onnx, run_outputs

        model = require_onnx().load(str(path))
        known = {o for n in model.graph.node for o in n.output}
        present = [n for n in names if n in known]
        graph_inputs = [i.name for i in model.graph.input]
        renamed = [{g: np.asarray(f[s]) for g, s in zip(graph_inputs, input_names)} for f in feeds]
        with tempfile.TemporaryDirectory() as scratch:
            values = run_outputs(model, present, Path(scratch), renamed)
        return {n: np.stack([np.asarray(v, dtype=np.float32) for v in values[n]]) for n in present}
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


def graph_order(path: Path, fmt: str, rows: Sequence[LayerError]) -> list[tuple[LayerError, str]]:
    """(table row, tensor name) for the rows whose tensor the artifact has, in the order its graph runs them."""
    if fmt == Format.ONNX:
        from toolkit.conversion.onnx.graph_io import require_onnx

        model = require_onnx().load(str(path))
        position = {n.name: (i, n.output[0]) for i, n in enumerate(model.graph.node) if n.output}
        found = [(position[r.name][0], r, position[r.name][1]) for r in rows if r.name in position]
    else:
        from ai_edge_litert.interpreter import Interpreter

        from toolkit.compat import litert as litert_compat

        interpreter = Interpreter(model_path=str(path))
        index = {d["name"]: d["index"] for d in interpreter.get_tensor_details()}
        producer = {int(t): i for i, op in enumerate(litert_compat.ops_details(interpreter)) for t in op["outputs"]}
        found = [(producer[index[r.name]], r, r.name) for r in rows if index.get(r.name) in producer]
    return [(row, tensor) for _, row, tensor in sorted(found, key=lambda item: item[0])]


def record(staging: Path, artifact: str, fmt: str, float_artifact: Path | None,
           feeds: Sequence[Mapping[str, np.ndarray]], input_names: Sequence[str]) -> str | None:
    """Write the probe files of one INT8 artifact (None: it has no layer table); the note for its record."""
    table = read_table(staging, artifact)
    if table is None or not table.rows:
        return None
    if fmt == Format.PTE:  # the XNNPACK delegate runs the whole graph as one call: no layer tensor to read
        return "no layer probe: an ExecuTorch program shows the runner no intermediate tensors"
    if float_artifact is None:
        return f"no layer probe: no fp32 {fmt} artifact to take the float layers from"
    samples = list(feeds[:PROBE_SAMPLES])
    order = graph_order(staging / artifact, fmt, table.rows)
    names = [t for _, t in order]
    floats = tensors(float_artifact, fmt, names, samples, input_names)
    quantized = tensors(staging / artifact, fmt, names, samples, input_names)
    layers: list[dict[str, Any]] = []  # Any: JSON values of probe.json
    arrays: dict[str, np.ndarray] = {}
    for row, tensor in order:
        if tensor not in floats or tensor not in quantized or floats[tensor].size != quantized[tensor].size:
            continue
        arrays[f"t_{len(layers)}"] = floats[tensor].astype(np.float16)
        table_error = row.rmse_range if math.isfinite(row.rmse_range) else 0.0
        layers.append({"layer": row.name, "op_type": row.op_type, "tensor": tensor,
                       "host_error": range_error(quantized[tensor], floats[tensor]), "table_error": table_error})
    if not layers:
        return "no layer probe: the float artifact has none of the table's layer tensors"
    if fmt == Format.ONNX:
        with_outputs(staging / artifact, [str(layer["tensor"]) for layer in layers], staging / debug_name(artifact))
    save_npz(staging / float_name(artifact), arrays)
    probe = {"samples": len(samples), "layers": layers}
    (staging / probe_name(artifact)).write_text(json.dumps(probe, indent=1) + "\n")  # last: a probe is complete
    return f"layer probe for a failed device check: {len(layers)} layers, {probe_name(artifact)}"


def with_outputs(source: Path, names: Sequence[str], target: Path) -> None:
    """Write to ``target`` the ONNX model at ``source`` with the tensors ``names`` added as graph outputs."""
    from toolkit.conversion.onnx.graph_io import require_onnx

    onnx = require_onnx()
    model = onnx.load(str(source))
    present = {o.name for o in model.graph.output}
    for name in names:
        if name not in present:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    onnx.save(model, str(target))
