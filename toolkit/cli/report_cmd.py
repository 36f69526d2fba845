"""``edgetk report (BUNDLE | --history) [--html OUT.html] [--store PATH] [--json]``.

For a bundle: the per-bundle table (what convert measured on the host beside the newest stored check on each
device). ``--history``: every stored check and the p50 trends. ``--html`` writes a self-contained page with
plots (matplotlib, embedded as base64 PNG); ``--json`` prints the data the page is drawn from
(docs/schemas/report.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("report")
@click.argument("bundle", required=False, type=click.Path(path_type=Path))
@click.option("--history", "whole_history", is_flag=True, help="Report the whole check history instead of a bundle.")
@click.option("--html", "html_out", type=click.Path(path_type=Path), default=None,
              help="Write a self-contained HTML page with plots here.")
@click.option("--device", default=None, help="Only checks of this device.")
@click.option("--store", type=click.Path(path_type=Path), default=None,
              help="Check history file (default $EDGETK_STORE or ~/.local/share/edgetk/history.sqlite).")
@click.option("--json", "as_json", is_flag=True, help="Print the report's data as one JSON document.")
def report(bundle: Path | None, whole_history: bool, html_out: Path | None, device: str | None,
           store: Path | None, as_json: bool) -> None:
    """Tables and plots for a bundle (host and device measurements) or for the whole check history."""
    from toolkit.errors import UsageError
    from toolkit.reporting.html import collect, write_html
    from toolkit.reporting.terminal import bundle_table, render_table, stdout_is_terminal

    if (bundle is None) == (not whole_history):
        raise UsageError("Pass either a BUNDLE directory or --history.",
                         hint="edgetk report bundles/NAME --html report.html, or edgetk report --history")
    data = collect(None if whole_history else bundle, store=store, device=device)
    if html_out is not None:
        write_html(data, html_out)
        click.echo(f"wrote {html_out}", err=True)
    if as_json:
        click.echo(json.dumps(data.to_dict(), indent=2))
        return
    colour = stdout_is_terminal()
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
