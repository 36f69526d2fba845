"""``edgetk inspect``: what is inside an artifact or a bundle (``toolkit.api.inspect``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # Any: click's parsed values

import click

from toolkit.cli._output import emit
from toolkit.cli.options import PathType, json_option

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path


@click.command("inspect")
@click.argument("path", type=PathType())
@click.option("--layers", is_flag=True, help="Also each INT8 artifact's layer-wise error table, worst layer first "
              "(bundles only).")
@json_option
def inspect(path: Path, as_json: bool, **values: Any) -> None:
    """Inputs, outputs, quantization, operator counts and size of a .tflite, .onnx or bundle."""
    from toolkit import api

    result = api.inspect(path, **values)
    if as_json:
        emit(result.to_dict())
        return
    from toolkit.reporting.report import inspect_text

    models = result.artifacts if isinstance(result, api.BundleInspection) else (result,)
    text = "\n\n".join(inspect_text(m) for m in models)
    if isinstance(result, api.BundleInspection) and result.layers is not None:
        from toolkit.conversion.layers import table_text

        tables = [table_text(file, table) for file, table in result.layers.items()]
        text += "\n\n" + ("\n\n".join(tables) if tables else "no layer-wise error table in this bundle "
                                                               "(written for INT8 artifacts only)")
    click.echo(text)
