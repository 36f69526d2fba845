"""Where a device's outputs part from the golden ones: the first layer whose error is beyond what quantization
explains.

When a check finds outputs that differ from the golden outputs, the host pushes the INT8 artifact's layer probe
(:mod:`toolkit.conversion.layer_probe`; never carried by ``deploy``) and the device runs the same samples with
its tensors exposed (the runner's ``layers`` command), each file checked against the manifest's sha256. The
first layer whose error exceeds ``2 x`` the host's own INT8 error there plus ``2 x`` the table's own error of
that layer, plus 0.005 of the range, is named.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.delivery import on_demand
from toolkit.delivery.bundle import LAYERS_DIR, PROBE_SAMPLES, debug_name, float_name, load_npz, probe_name
from toolkit.model.records import JsonDict, JsonObject
from toolkit.model.vocabulary import Format, RunnerErrorKind
from toolkit.verification.dense import range_error

if TYPE_CHECKING:
    from toolkit.delivery.bundle import Bundle
    from toolkit.delivery.deployment import Device

FLOOR = 0.005  # of the float range: below this no layer counts as diverged
TIMEOUT_S = 600.0


def limit_of(layer: JsonObject) -> float:
    """The error a layer may show on a device before it counts as diverged."""
    return 2.0 * float(layer.get("host_error") or 0.0) + 2.0 * float(layer.get("table_error") or 0.0) + FLOOR


def first_divergence(layers: Sequence[JsonObject], device: Mapping[str, np.ndarray],
                     floats: Mapping[str, np.ndarray]) -> JsonDict:
    """Compare the device's tensors with the float ones layer by layer, in graph order."""
    compared = []
    first = None
    for j, layer in enumerate(layers):
        key = f"t_{j}"
        if key not in device or key not in floats:
            continue
        error = range_error(device[key].astype(np.float32), floats[key].astype(np.float32))
        limit = limit_of(layer)
        entry = {"layer": layer["layer"], "op_type": layer.get("op_type"), "error": _num(error),
                 "host_error": _num(float(layer.get("host_error") or 0.0)), "limit": _num(limit),
                 "diverged": not error <= limit}
        compared.append(entry)
        if first is None and entry["diverged"]:
            first = entry
    return {"available": True, "first": first, "layers": compared}


def _num(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


def locate(device: Device, bundle: Bundle, vdir: str, artifact: str) -> JsonDict:
    """Run the probe on the device; ``{"available": False, "note"}`` when the bundle has none or it fails."""
    probe, floats = probe_name(artifact), float_name(artifact)
    if not on_demand.recorded(bundle, probe) or not on_demand.recorded(bundle, floats):
        return {"available": False, "note": f"the layer probe of this artifact {on_demand.UNRECORDED}"
                if (bundle.path / probe).is_file() else "the bundle carries no layer probe for this "
                "artifact (INT8 artifacts with a layer table get one at convert time)"}
    doc = json.loads(on_demand.verified(bundle, probe).read_text())
    fmt = next(a.format for a in bundle.manifest.artifacts if a.file == artifact)
    pushed = [probe, debug_name(artifact)] if fmt == Format.ONNX else [probe]
    on_demand.push(device, bundle, vdir, pushed)
    runner = bundle.manifest.runner.file if bundle.manifest.runner else "edgetk_runner.py"
    out = f"{vdir}/{LAYERS_DIR}/out/{artifact}.npz"
    argv = [device.python, f"{vdir}/{runner}", "layers", "--bundle", vdir, "--artifact", artifact, "--out", out,
            "--samples", str(doc.get("samples") or PROBE_SAMPLES)]
    done = device.conn.run(argv, timeout=TIMEOUT_S)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"error": {"message": (done.stderr.strip().splitlines() or ["no output"])[-1]}}
    if answer.get("error") or not answer.get("ok"):
        error = answer.get("error") or {}
        refused = "refused the layer probe" if error.get("kind") == RunnerErrorKind.INTEGRITY else "could not expose the layers"
        return {"available": False, "note": f"the device {refused}: {error.get('message')}"}
    with tempfile.TemporaryDirectory(prefix="edgetk-layers-") as scratch:
        device.conn.get(out, Path(scratch) / "device.npz")
        values = load_npz(Path(scratch) / "device.npz")
    return first_divergence(doc["layers"], values, load_npz(on_demand.verified(bundle, floats)))


def text(found: JsonObject) -> str:
    """The clause the failed outputs gate gets."""
    if not found.get("available"):
        return f"; no layer named: {found.get('note')}"
    first = found.get("first")
    if first is None:
        return (f"; no layer diverges beyond its expected quantization error ({len(found.get('layers') or [])} "
                "compared): the difference is after the last probed layer")
    return (f"; first diverging layer: {first['layer']} ({first['op_type']}), error {first['error']} of its float "
            f"range where quantization explains up to {first['limit']} (host INT8: {first['host_error']})")
