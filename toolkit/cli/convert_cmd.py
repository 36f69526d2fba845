"""``edgetk convert``: a source model -> a verified bundle directory."""

from __future__ import annotations

import json
from typing import Any

import click

from toolkit.cli.options import build_convert_options, convert_options


@click.command("convert")
@click.argument("source")
@convert_options
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as one JSON document.")
def convert(source: str, as_json: bool, **values: Any) -> None:
    """Convert SOURCE (Keras, SavedModel, ONNX, TFLite, PyTorch) into a verified bundle."""
    from toolkit.pipeline import convert_bundle
    from toolkit.report import convert_table

    result = convert_bundle(build_convert_options(source, values))
    if as_json:
        click.echo(json.dumps({"bundle": str(result.bundle_dir), "cached": result.cached, **result.manifest.to_dict()}))
    else:
        click.echo(convert_table(result.manifest, bundle_dir=result.bundle_dir, cached=result.cached))
