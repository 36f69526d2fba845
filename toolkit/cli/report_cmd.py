"""``edgetk report (BUNDLE | --history) [--html OUT.html] [--store PATH] [--json]`` (``toolkit.api.make_report``):
what a bundle's or the history's report holds is told in ``toolkit.reporting.html``; ``--json`` prints the
data the page is drawn from (docs/schemas/report.md).
"""

from __future__ import annotations

from typing import Any  # Any: click's parsed values

import click

from toolkit.cli._output import emit
from toolkit.cli.options import PathType


@click.command("report")
@click.argument("bundle", required=False, type=PathType())
@click.option("--history", "whole_history", is_flag=True, help="Report the whole check history instead of a bundle.")
@click.option("--html", "html", type=PathType(), default=None, help="Write a self-contained HTML page with plots here.")
@click.option("--device", default=None, help="Only checks of this device.")
@click.option("--store", default=None, metavar="PATH|URL",
              help="Check history file (default $EDGETK_STORE or ~/.local/share/edgetk/history.sqlite).")
@click.option("--json", "as_json", is_flag=True, help="Print the report's data as one JSON document.")
def report(as_json: bool, **values: Any) -> None:
    """Tables and plots for a bundle (host and device measurements) or for the whole check history."""
    from toolkit import api
    from toolkit.reporting.terminal import bundle_table, render_table, stdout_is_terminal

    data = api.make_report(**values)
    if values["html"] is not None:
        click.echo(f"wrote {values['html']}", err=True)
    if as_json:
        emit(data.to_dict())
        return
    colour = stdout_is_terminal()
    if data.selected:
        from toolkit.reporting.html import selection_rows

        click.echo(render_table(("device", "bundle", "selected", "p50 ms", "pinned", "why", "proposed"),
                                [[str(c) for c in row] for row in selection_rows(data.selected)], colour=colour),
                   color=colour)
        click.echo("")
    if data.manifest is not None:
        click.echo(bundle_table(data.manifest, data.latest, colour=colour, bundle_dir=data.bundle_dir), color=colour)
        if not data.latest:
            click.echo("\nno stored check of this bundle version yet (edgetk check BUNDLE --device ...)")
        return
    if not data.history:
        click.echo(f"no checks stored in {data.store} yet")
        return
    rows = [
        [t["device"], t["bundle"], t["artifact"], str(t["checks"]), str(t["passed"]),
         f"{t['last_p50_ms']:.3f}" if t.get("last_p50_ms") is not None else "-",
         f"{t['change_pct']:+.1f}%" if t.get("change_pct") is not None else "-"]
        for t in data.trends
    ]
    click.echo(render_table(("device", "bundle", "artifact", "checks", "passed", "last p50 ms", "change"), rows,
                            colour=colour), color=colour)
