"""Which ops of a TFLite model a recipe's ``nodes_to_exclude`` names: op output tensor names, builtin op names
(``FULLY_CONNECTED``) or Keras layer names, resolved against the calibrated model's ops."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from toolkit.errors import UsageError


def op_outputs(model: bytes, workdir: Path) -> list[tuple[str, tuple[str, ...]]]:
    from toolkit.runtimes.inspection.tflite import parse_tflite

    with tempfile.NamedTemporaryFile(suffix=".tflite", dir=workdir, delete=False) as handle:
        handle.write(model)
    try:
        return [(op.name, op.output_names) for op in parse_tflite(Path(handle.name)).ops]
    finally:
        os.unlink(handle.name)


def _layer_scopes(tensor_names: Sequence[str], layers: Sequence[str]) -> dict[str, set[str]]:
    """Keras layer name -> the name scopes its ops got. TensorFlow uniquifies scopes (``conv2d`` may become
    ``conv2d_1``, ``conv2d_1`` then ``conv2d_1_2``), so a scope goes to a layer once it has one candidate left."""
    scopes = {comp for name in tensor_names for part in name.split(";") for comp in part.split("/")[:-1]}

    def candidates(scope: str, free: set[str]) -> list[str]:
        return [l for l in free if scope == l or re.fullmatch(re.escape(l) + r"_\d+", scope)]

    free = set(layers)
    pending = {s for s in scopes if candidates(s, free)}
    result: dict[str, set[str]] = {}
    progress = True
    while progress and pending:
        progress = False
        for scope in sorted(pending):
            options = candidates(scope, free)
            if len(options) == 1:
                result.setdefault(options[0], set()).add(scope)
                free.discard(options[0])
                pending.discard(scope)
                progress = True
            elif not options:
                pending.discard(scope)
    return result


def resolve_nodes(
    requested: Sequence[str], ops: Sequence[tuple[str, tuple[str, ...]]], *, layers: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """Map ``nodes_to_exclude`` entries (op output tensor names, builtin op names such as ``FULLY_CONNECTED``, or
    Keras layer names in ``layers``) to (denylisted node tensor names, denylisted op types)."""
    tensor_names = [name for _, outs in ops for name in outs]
    op_types = {op for op, _ in ops}
    scope_map = _layer_scopes(tensor_names, layers)
    nodes: list[str] = []
    types: list[str] = []
    unknown: list[str] = []
    for entry in requested:
        if entry in tensor_names:
            nodes.append(entry)
            continue
        # The debugger reports some names with an index appended (``.../Squeeze1``).
        prefixed = [n for n in tensor_names if entry.startswith(n) and entry[len(n) :].isdigit()]
        if prefixed:
            nodes.append(max(prefixed, key=len))
            continue
        if entry in op_types:
            types.append(entry)
            continue
        scopes = scope_map.get(entry) or {entry}
        matched = [
            name
            for name in tensor_names
            if any(comp in scopes for part in name.split(";") for comp in part.split("/")[:-1])
        ]
        if matched:
            nodes.extend(m for m in matched if m not in nodes)
        else:
            unknown.append(entry)
    if unknown:
        sample = ", ".join(sorted({n.split(";")[0] for n in tensor_names})[:8])
        raise UsageError(
            f"nodes_to_exclude names nodes this model does not have: {', '.join(unknown)}.",
            hint=f"Use op output tensor names (e.g. {sample}), Keras layer names, or op types such as "
            "FULLY_CONNECTED.",
        )
    return nodes, types
