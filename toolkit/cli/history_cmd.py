"""``edgetk history [--device D] [--bundle B] [--json] [--store PATH]``: stored checks and trends
(``toolkit.api.history``).

``--json`` prints a list of stored check reports, each with ``device``, ``bundle``, ``version``,
``created_at``, ``check_id``, ``run_id`` and ``passed`` added (docs/schemas/deploy.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # Any: click's parsed values

import click

from toolkit.cli._output import emit
from toolkit.cli.options import PathType

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path


_STORE_HELP = ("Check history: a file (SQLite) or postgresql://USER@HOST:PORT/DB (default $EDGETK_STORE or "
               "~/.local/share/edgetk/history.sqlite).")


@click.group(invoke_without_command=True)
@click.option("--device", default=None, help="Only checks of this device (its name as shown by check).")
@click.option("--bundle", default=None, help="Only checks of this bundle name.")
@click.option("--limit", type=click.IntRange(1), default=None, help="Only the newest N checks.")
@click.option("--store", default=None, metavar="PATH|URL", help=_STORE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the stored reports as one JSON list.")
@click.pass_context
def history(ctx: click.Context, /, as_json: bool, **values: Any) -> None:
    """List stored checks (who ran them, where), and the p50 trend per device, bundle and artifact.
    ``history sync`` and ``history import`` fill the history from elsewhere."""
    if ctx.invoked_subcommand is not None:
        return
    from toolkit import api

    result = api.history(**values)
    if as_json:
        emit(result.to_dict())
        return
    checks = result.checks
    if not checks:
        click.echo("no checks stored yet (run `edgetk check` or `edgetk deploy --check`)")
        return
    click.echo(f"{'created_at':<27} {'check_id':<15} {'device':<16} {'bundle':<16} {'artifact':<22} "
               f"{'p50 ms':>9} {'p90 ms':>9}  gates  by")
    for c in checks:
        p50 = f"{c.p50_ms:.3f}" if c.p50_ms is not None else "-"
        p90 = f"{c.p90_ms:.3f}" if c.p90_ms is not None else "-"
        by = f"{c.checked_by or '?'}@{c.controller or '?'}" if (c.checked_by or c.controller) else "-"
        click.echo(f"{c.created_at[:26]:<27} {c.check_id:<15} {c.device[:16]:<16} {c.bundle[:16]:<16} "
                   f"{c.artifact[:22]:<22} {p50:>9} {p90:>9}  {'pass' if c.passed else 'FAIL'}   {by}")
    click.echo("\ntrends (p50, first -> last):")
    for t in result.trends:
        change = f"{t.change_pct:+.1f}%" if t.change_pct is not None else "n/a"
        first = f"{t.first_p50_ms:.3f}" if t.first_p50_ms is not None else "-"
        last = f"{t.last_p50_ms:.3f}" if t.last_p50_ms is not None else "-"
        click.echo(f"  {t.device} {t.bundle} {t.artifact}: {t.checks} checks ({t.passed} passed), "
                   f"{first} -> {last} ms ({change})")


@history.command("sync")
@click.option("--store", default=None, metavar="PATH|URL", help=_STORE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def history_sync(store: str | None, as_json: bool) -> None:
    """Copy the results that --store-fallback kept locally into the history (each check once), then empty
    the local file."""
    from toolkit import api

    result = api.history_sync(store=store)
    if as_json:
        emit(result.to_dict())
        return
    click.echo(f"{result.copied} check(s) copied from {result.source} to {result.store}"
               + (f" ({result.already_there} were there already)" if result.already_there else ""))


@history.command("import")
@click.argument("paths", nargs=-1, required=True, type=PathType())
@click.option("--device", default=None, help="Record the checks under this device name (default: the device's own).")
@click.option("--store", default=None, metavar="PATH|URL", help=_STORE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def history_import(paths: tuple[Path, ...], device: str | None, store: str | None, as_json: bool) -> None:
    """Record check reports that devices left in reports/ of the toolkit's home there (the Mender update module
    writes them): files, or folders of them."""
    from toolkit import api

    result = api.history_import(list(paths), store=store, device=device)
    if as_json:
        emit(result.to_dict())
        return
    click.echo(f"{result.checks} check(s) from {result.files} file(s) recorded in {result.store}")
