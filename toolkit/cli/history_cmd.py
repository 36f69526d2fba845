"""``edgetk history [--device D] [--bundle B] [--json] [--store PATH]``: stored checks and trends
(``toolkit.api.history``).

``--json`` prints a list of stored check reports, each with ``device``, ``bundle``, ``version``,
``created_at``, ``check_id``, ``run_id`` and ``passed`` added (docs/schemas/deploy.md).
"""

from __future__ import annotations

from typing import Any

import click

from toolkit.cli._output import emit
from toolkit.cli.options import PathType


@click.command()
@click.option("--device", default=None, help="Only checks of this device (its name as shown by check).")
@click.option("--bundle", default=None, help="Only checks of this bundle name.")
@click.option("--limit", type=click.IntRange(1), default=None, help="Only the newest N checks.")
@click.option("--store", type=PathType(), default=None,
              help="Check history file (default $EDGETK_STORE or ~/.local/share/edgetk/history.sqlite).")
@click.option("--json", "as_json", is_flag=True, help="Print the stored reports as one JSON list.")
def history(as_json: bool, **values: Any) -> None:
    """List stored checks, and the p50 trend per device, bundle and artifact."""
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
               f"{'p50 ms':>9} {'p90 ms':>9}  gates")
    for c in checks:
        p50 = f"{c.p50_ms:.3f}" if c.p50_ms is not None else "-"
        p90 = f"{c.p90_ms:.3f}" if c.p90_ms is not None else "-"
        click.echo(f"{c.created_at[:26]:<27} {c.check_id:<15} {c.device[:16]:<16} {c.bundle[:16]:<16} "
                   f"{c.artifact[:22]:<22} {p50:>9} {p90:>9}  {'pass' if c.passed else 'FAIL'}")
    click.echo("\ntrends (p50, first -> last):")
    for t in result.trends:
        change = f"{t.change_pct:+.1f}%" if t.change_pct is not None else "n/a"
        first = f"{t.first_p50_ms:.3f}" if t.first_p50_ms is not None else "-"
        last = f"{t.last_p50_ms:.3f}" if t.last_p50_ms is not None else "-"
        click.echo(f"  {t.device} {t.bundle} {t.artifact}: {t.checks} checks ({t.passed} passed), "
                   f"{first} -> {last} ms ({change})")
