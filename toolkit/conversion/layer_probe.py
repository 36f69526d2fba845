"""The layer probe written next to each INT8 artifact with a layer table, so a failed device check names the
first diverging layer (:mod:`toolkit.checks.divergence`). On the first golden samples the host keeps, per table
layer in graph order, the float values (float16, ``layers/<artifact>.float.npz``) and the INT8 artifact's own
error there (``layers/<artifact>.probe.json``, RMS error over the float range as ``rmse_range``); for ONNX also
a copy with those tensors as graph outputs (``layers/<artifact>.debug.onnx``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.conversion.layers import read_table
from toolkit.delivery.bundle import PROBE_SAMPLES, debug_name, float_name, probe_name, save_npz
from toolkit.verification.dense import range_error

if TYPE_CHECKING:
    from toolkit.conversion.backend import Backend

def record(staging: Path, artifact: str, backend: Backend, float_artifact: Path | None,
           feeds: Sequence[Mapping[str, np.ndarray]], input_names: Sequence[str]) -> str | None:
    """Write the probe files of one INT8 artifact (None: it has no layer table); the note for its record. The
    artifact's backend reads its tensors (``Backend.probe_order``, ``probe_tensors``, ``probe_files``)."""
    table = read_table(staging, artifact)
    if table is None or not table.rows:
        return None
    if backend.probe_refusal:  # ExecuTorch: the XNNPACK delegate runs the whole graph as one call
        return backend.probe_refusal
    if float_artifact is None:
        return f"no layer probe: no fp32 {backend.format} artifact to take the float layers from"
    samples = list(feeds[:PROBE_SAMPLES])
    order = backend.probe_order(staging / artifact, table.rows)
    names = [t for _, t in order]
    floats = backend.probe_tensors(float_artifact, names, samples, input_names)
    quantized = backend.probe_tensors(staging / artifact, names, samples, input_names)
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
    backend.probe_files(staging / artifact, [str(layer["tensor"]) for layer in layers], staging / debug_name(artifact))
    save_npz(staging / float_name(artifact), arrays)
    probe = {"samples": len(samples), "layers": layers}
    (staging / probe_name(artifact)).write_text(json.dumps(probe, indent=1) + "\n")  # last: a probe is complete
    return f"layer probe for a failed device check: {len(layers)} layers, {probe_name(artifact)}"
