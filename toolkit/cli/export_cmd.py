"""``edgetk export BUNDLE --mender --device-type T [-o FILE]`` (``toolkit.api.export_mender``): the bundle as a
Mender module-image artifact for pull-based fleets, and the ``edgetk`` Update Module beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # Any: click's parsed values

import click

from toolkit.cli._output import emit
from toolkit.cli.options import PathType

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path


@click.command()
@click.argument("bundle", type=PathType())
@click.option("--mender", is_flag=True, required=True, help="Write a Mender artifact (the one export format so far).")
@click.option("--device-type", "device_types", multiple=True, metavar="TYPE",
              help="Mender device type the artifact is for, e.g. raspberrypi4 (repeatable).")
@click.option("-o", "--output", type=PathType(), default=None, help="Artifact file (default ./<bundle name>.mender).")
@click.option("--artifact-name", default=None, help="Mender artifact name (default <bundle name>-<version>).")
@click.option("--budget-ms", type=float, default=None,
              help="p90 budget the device's check enforces (default: the bundle's check policy).")
@click.option("--runs", type=click.IntRange(1), default=20, show_default=True, help="Timed runs of the device check.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, help="Untimed runs first.")
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def export(bundle: Path, mender: bool, output: Path | None, as_json: bool, **values: Any) -> None:
    """Package BUNDLE for another delivery system: a Mender artifact (install the Update Module written next to
    it on each device once, as /usr/share/mender/modules/v3/edgetk)."""
    from pathlib import Path

    from toolkit import api
    from toolkit.delivery.bundle import read_bundle

    target = output if output is not None else Path(f"{read_bundle(bundle).name}.mender")
    result = api.export_mender(bundle, output=target, **values)
    if as_json:
        emit(result.to_dict())
        return
    click.echo(f"wrote {result.artifact} ({result.bytes / 1e6:.2f} MB, artifact {result.artifact_name}, "
               f"device types {', '.join(result.device_types)})")
    click.echo(f"Update Module: {result.module} -> install once on each device as /usr/share/mender/modules/v3/edgetk")
