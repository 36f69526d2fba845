"""``edgetk convert``: a source model -> a verified bundle directory (``toolkit.api.convert``)."""

from __future__ import annotations

from typing import Any  # Any: click's parsed values

import click

from toolkit.cli._output import emit
from toolkit.cli.options import convert_options, json_option


@click.command("convert")
@click.argument("source")
@convert_options
@json_option
def convert(source: str, as_json: bool, **values: Any) -> None:
    """Convert SOURCE (Keras, SavedModel, ONNX, TFLite, PyTorch) into a verified bundle."""
    from toolkit import api
    from toolkit.model.options import ConvertOptions, keywords_from_params

    result = api.convert(source, **keywords_from_params(values, ConvertOptions))
    if as_json:
        emit(result.to_dict())
        return
    from toolkit.reporting.report import convert_table

    click.echo(convert_table(result.manifest, bundle_dir=result.bundle_dir, cached=result.cached))
