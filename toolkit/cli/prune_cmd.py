"""``edgetk prune NAME``: old versions of a bundle away, the current one and the rollback target kept
(``toolkit.api.prune``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # Any: click's parsed values

import click

from toolkit.cli._fleet import finish
from toolkit.cli.deploy_cmd import break_lock_option
from toolkit.cli.options import device_options, json_option

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.api.results import DeviceResult
    from toolkit.model.answers import PruneAnswer


def _render(result: DeviceResult[PruneAnswer]) -> list[str]:
    done = result.answer
    if done is None or (not done.removed and not done.kept):
        return []
    removed = ", ".join(v[:12] for v in done.removed) or "nothing"
    kept = ", ".join(v[:12] + (" (current)" if v == done.current else " (rollback target)"
                               if v == done.rollback_target else "") for v in done.kept)
    return [f"removed {removed}; freed {done.freed_bytes / 1e6:.1f} MB", f"kept {kept}"]


@click.command()
@click.argument("name")
@device_options
@click.option("--keep", "keep", type=click.IntRange(min=1), default=2, show_default=True,
              help="Versions to keep: the current one and those installed before it (what rollbacks return to); "
              "the rollback target is kept whatever this says.")
@break_lock_option
@json_option
def prune(name: str, as_json: bool, **values: Any) -> None:
    """Remove old versions of bundle NAME from devices, never the current one or the one a rollback returns to."""
    from toolkit import api

    finish(api.prune(name, **values), as_json=as_json, render=_render)
