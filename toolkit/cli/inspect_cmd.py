"""``edgetk inspect``: what is inside an artifact or a bundle."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("inspect")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def inspect(path: Path, as_json: bool) -> None:
    """Inputs, outputs, quantization, operator counts and size of a .tflite, .onnx or bundle."""
    from toolkit.bundle import read_bundle
    from toolkit.errors import UsageError
    from toolkit.inspection import inspect_model
    from toolkit.report import inspect_text

    if not path.exists():
        raise UsageError(f"{path} does not exist.", hint="Pass a .tflite, an .onnx or a bundle directory.")
    if path.is_dir():
        bundle = read_bundle(path)
        models = [inspect_model(path / a.file) for a in bundle.manifest.artifacts]
        doc = {"bundle": str(path), "manifest": bundle.manifest.to_dict(), "artifacts": [m.to_dict() for m in models]}
    else:
        models = [inspect_model(path)]
        doc = models[0].to_dict()
    if as_json:
        click.echo(json.dumps(doc))
    else:
        click.echo("\n\n".join(inspect_text(m) for m in models))
