"""``edgetk inspect``: what is inside an artifact or a bundle (``toolkit.api.inspect``)."""

from __future__ import annotations

from typing import Any

import click

from toolkit.cli._output import emit
from toolkit.cli.options import PathType, json_option


@click.command("inspect")
@click.argument("path", type=PathType())
@json_option
def inspect(path: Any, as_json: bool) -> None:
    """Inputs, outputs, quantization, operator counts and size of a .tflite, .onnx or bundle."""
    from toolkit import api

    result = api.inspect(path)
    if as_json:
        emit(result.to_dict())
        return
    from toolkit.report import inspect_text

    models = result.artifacts if isinstance(result, api.BundleInspection) else (result,)
    click.echo("\n\n".join(inspect_text(m) for m in models))
