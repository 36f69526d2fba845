"""Click options shared by several commands (convert, run), so each is declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from toolkit.types import FORMATS, PRECISIONS

F = Callable[..., Any]


def convert_options(func: F) -> F:
    """The options of ``edgetk convert`` that ``edgetk run`` also takes."""
    decorators = [
        click.option("--target", "target", metavar="NAME", help="Target profile (default: this machine's)."),
        click.option("--targets-dir", "targets_dirs", multiple=True, type=click.Path(path_type=Path),
                     help="Extra folder of target profiles (repeatable)."),
        click.option("--calibration", type=click.Path(path_type=Path),
                     help="Calibration data: .npy, .npz (keys = input names, or x) or an image folder."),
        click.option("--calibration-samples", type=click.IntRange(1), metavar="N", help="Use a deterministic subset of N samples."),
        click.option("--calibration-method", type=click.Choice(["minmax", "entropy", "percentile"]),
                     help="ONNX static INT8 calibration method."),
        click.option("--eval-data", type=click.Path(path_type=Path),
                     help="Held-out data for verification (.npz; labels under y give accuracy)."),
        click.option("--precision", "precisions", multiple=True, type=click.Choice(PRECISIONS),
                     help="Build these precisions instead of the profile's recipes (repeatable)."),
        click.option("--format", "formats", multiple=True, type=click.Choice(FORMATS),
                     help="Artifact formats to build (repeatable)."),
        click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D0,D1,...",
                     help="Pin an input's shape (batch defaults to 1)."),
        click.option("--dynamic-batch", is_flag=True, help="Keep the batch dimension dynamic where the route can."),
        click.option("--io-dtype", type=click.Choice(["int8", "uint8", "float32"]),
                     help="Input/output type of TFLite INT8 artifacts (default int8)."),
        click.option("--labels", type=click.Path(path_type=Path), help="Class names, one a line."),
        click.option("--weights", type=click.Path(path_type=Path), help="State dict for a PyTorch factory source."),
        click.option("--threads", type=click.IntRange(1), help="Threads for host timing (default: the profile's)."),
        click.option("--name", help="Bundle name (default: <source stem>-<target>)."),
        click.option("--out", type=click.Path(path_type=Path), help="Bundle directory (default ./bundles/<name>)."),
        click.option("--force", is_flag=True, help="Replace an existing bundle."),
        click.option("--no-cache", is_flag=True, help="Convert again even if a cached result exists."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def build_convert_options(source: str, values: dict[str, Any]) -> Any:
    """ConvertOptions from the parsed click values (imports the pipeline lazily)."""
    from toolkit.calibration import parse_input_shapes
    from toolkit.pipeline import ConvertOptions

    return ConvertOptions(
        source=source,
        target=values.get("target"),
        calibration=values.get("calibration"),
        eval_data=values.get("eval_data"),
        precisions=tuple(values.get("precisions") or ()),
        formats=tuple(values.get("formats") or ()),
        input_shapes=parse_input_shapes(values.get("input_shapes") or ()),
        name=values.get("name"),
        out=values.get("out"),
        force=bool(values.get("force")),
        calibration_samples=values.get("calibration_samples"),
        labels=values.get("labels"),
        weights=values.get("weights"),
        targets_dirs=tuple(values.get("targets_dirs") or ()),
        dynamic_batch=bool(values.get("dynamic_batch")),
        io_dtype=values.get("io_dtype"),
        calibration_method=values.get("calibration_method"),
        threads=values.get("threads"),
        use_cache=not values.get("no_cache"),
    )
