"""How the device commands print an ``api.FleetReport``: a per-device table (or its ``--json`` document), every
device's error on stderr in both modes, and the worst device's exit code. Light imports only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any  # Any: an api.FleetReport (imported lazily) and its JSON entries

import click

from toolkit.cli._output import done, emit

Render = Callable[[Mapping[str, object]], list[str]]


def finish(report: Any, *, as_json: bool, render: Render) -> None:
    """Print the fleet's result (table or JSON) and exit with its code (the worst device's)."""
    doc = report.to_dict()
    entries = doc["devices"]
    if as_json:
        emit(doc)
    else:
        for entry in entries:
            click.echo(f"{'ok    ' if entry['ok'] else 'FAILED'} {entry['device']}")
            for line in render(entry):
                click.echo(f"       {line}")
    for entry in entries:  # the plain error goes to stderr with or without --json
        if entry["error"]:  # the device named once, whether the message names it already or not
            named = entry["error"].startswith(f"{entry['device']}: ")
            click.echo(f"error: {entry['error']}" if named else f"error: {entry['device']}: {entry['error']}",
                       err=True)
    if len(entries) > 1:
        failed = sum(1 for e in entries if not e["ok"])
        click.echo(f"{len(entries) - failed} of {len(entries)} devices succeeded", err=True)
    rollout = doc.get("rollout")
    if rollout:  # deploy --waves: one line per wave, why it stopped, what went back
        for wave in rollout["waves"]:
            click.echo(f"wave {wave['wave']}: {len(wave['devices'])} device(s), {len(wave['failed'])} failed "
                       f"({wave['failed_pct']:g}%)" + (f": {', '.join(wave['failed'])}" if wave["failed"] else ""),
                       err=True)
        if rollout["stopped"]:
            click.echo(f"rollout stopped: {rollout['stopped']}; not started: {len(rollout['not_started'])}", err=True)
        for back in rollout["rolled_back"]:
            click.echo(f"rolled back {back['device']}: {'ok' if back['ok'] else back['error']}", err=True)
    store = getattr(report, "store", None)
    lines = store.lines() if store is not None else []  # the history was unavailable: say what happened
    for index, line in enumerate(lines):
        click.echo(f"error: {line}" if index == 0 else f"  {line}", err=True)
    done(report.exit_code)
