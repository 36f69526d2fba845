"""The layer table of a run's INT8 recipe, measured once by its backend (:func:`table_for`) and shared by selective
quantization and the bundle (:func:`bundle_table` writes ``layers/<artifact>.json``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from toolkit.conversion.base import BuiltArtifact
from toolkit.conversion.layers import LayerTable, table_path
from toolkit.conversion.run import Candidate, ConvertRun
from toolkit.delivery.bundle import layer_table_name
from toolkit.errors import ToolkitError
from toolkit.model.recipe import Recipe
from toolkit.model.vocabulary import Precision


def table_for(run: ConvertRun, recipe: Recipe, built: BuiltArtifact) -> LayerTable:
    """The table of ``recipe`` quantized in full (``nodes_to_exclude`` dropped), measured once per run by its
    backend and shared by selective quantization and the bundle (ONNX: ``built`` when it is the full one)."""
    from toolkit.conversion import cache

    plain = dataclasses.replace(recipe, nodes_to_exclude=())
    key = cache.recipe_key(plain)
    cached = run.caches.layer_tables.get(key)
    if cached is not None:
        return cached
    table = run.backend(recipe.format).layer_table(run.request(plain), None if recipe.nodes_to_exclude else built)
    run.caches.layer_tables[key] = table
    return table


def bundle_table(run: ConvertRun, item: Candidate, staging: Path) -> str | None:
    """Write ``layers/<artifact>.json`` for an INT8 artifact; the note for its record (None: not INT8). A failed
    analysis never costs the artifact: the note says why the table is missing."""
    from toolkit.quiet import native_stderr_silenced

    if item.recipe.precision != Precision.INT8 or not run.data.calibration.feeds:
        return None
    file = item.record.file
    try:
        with native_stderr_silenced():
            table = table_for(run, item.recipe, item.built).with_float(item.record.float_nodes)
    except ToolkitError as exc:
        return f"no layer-wise error table: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - a framework's own error: the artifact stays, the table is missing
        return f"no layer-wise error table: {type(exc).__name__}: {str(exc)[:200]}"
    path = table_path(staging, file)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(table.to_dict(), indent=1) + "\n")
    worst = table.worst
    summary = f" (worst: {worst.name} {worst.op_type}, channel error {worst.channel_error:.3g})" if worst else ""
    kind = "A16W8" if item.recipe.a16w8 else "int8"
    return f"layer-wise {kind} error table: {layer_table_name(file)}{summary}"
