"""How the device commands print an ``api.FleetReport``: a per-device table (or its ``--json`` document), every
device's error on stderr in both modes, and the worst device's exit code. Light imports only."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import click

from toolkit.cli._output import done, emit

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.api.results import DeviceResult, FleetReport
    from toolkit.model.answers import DeviceAnswer

A = TypeVar("A", bound="DeviceAnswer | None")  # the verb's answer (toolkit.model.answers); None: deploy and check


def finish(report: FleetReport[A], *, as_json: bool, render: Callable[[DeviceResult[A]], list[str]]) -> None:
    """Print the fleet's result (table or JSON) and exit with its code (the worst device's); ``render`` gives a
    device's lines from its typed result."""
    doc = report.to_dict()
    devices = report.devices
    if as_json:
        emit(doc)
    else:
        for device in devices:
            click.echo(f"{'ok    ' if device.ok else 'FAILED'} {device.device}")
            for line in render(device):
                click.echo(f"       {line}")
    for device in devices:  # the plain error goes to stderr with or without --json
        if device.error:  # the device named once, whether the message names it already or not
            named = device.error.startswith(f"{device.device}: ")
            click.echo(f"error: {device.error}" if named else f"error: {device.device}: {device.error}", err=True)
    if len(devices) > 1:
        failed = sum(1 for d in devices if not d.ok)
        click.echo(f"{len(devices) - failed} of {len(devices)} devices succeeded", err=True)
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
    store = report.store
    lines = store.lines() if store is not None else []  # the history was unavailable: say what happened
    for index, line in enumerate(lines):
        click.echo(f"error: {line}" if index == 0 else f"  {line}", err=True)
    done(report.exit_code)
