"""What the device commands share: the device-selection options, resolving them to specs, running a task on
every device (bounded concurrency), and the JSON/table output. Light imports only (no paramiko here)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

from toolkit.devices.fleet import FleetResult, run_fleet
from toolkit.devices.spec import DeviceSpec
from toolkit.errors import worst_exit_code

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def device_options(func: F) -> F:
    """--device (repeatable), --inventory, --group, --parallel, --trust-new-host, --known-hosts."""
    options = [
        click.option("--device", "devices", multiple=True, metavar="SPEC",
                     help="local, user@host[:port], an ~/.ssh/config alias or an inventory name (repeatable)."),
        click.option("--inventory", type=click.Path(path_type=Path), default=None,
                     help="TOML inventory of devices ([devices.NAME] tables)."),
        click.option("--group", default=None, help="Only the inventory's devices in this group."),
        click.option("--parallel", type=click.IntRange(1, 256), default=8, show_default=True,
                     help="Devices handled at once."),
        click.option("--trust-new-host", is_flag=True,
                     help="Accept and record the host key of a device not in known_hosts (changed keys are "
                     "always refused)."),
        click.option("--known-hosts", type=click.Path(path_type=Path), default=None,
                     help="known_hosts file to verify against (default ~/.ssh/known_hosts)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@dataclass(frozen=True)
class Selection:
    specs: tuple[DeviceSpec, ...]
    parallel: int
    trust_new_host: bool
    known_hosts: str | None

    def open(self, spec: DeviceSpec) -> Any:
        from toolkit.devices import open_connection

        return open_connection(
            spec, trust_new_host=self.trust_new_host, known_hosts=self.known_hosts or spec.known_hosts
        )

    def run(self, task: Callable[[DeviceSpec], T]) -> FleetResult[T]:
        return run_fleet(self.specs, task, parallel=self.parallel)


def resolve_devices(
    devices: Sequence[str], inventory: Path | None, group: str | None, parallel: int, trust_new_host: bool,
    known_hosts: Path | None,
) -> Selection:
    """The devices named by the options, in order, without duplicates."""
    from toolkit.devices.inventory import resolve_specs

    specs = resolve_specs(devices, inventory=inventory, group=group)
    return Selection(specs, parallel, trust_new_host, str(known_hosts) if known_hosts else None)


@dataclass
class DeviceEntry:
    """One device's line in the output (and in ``--json``'s ``devices`` list)."""

    device: str
    ok: bool
    error: str | None
    exit_code: int
    reports: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device": self.device, "ok": self.ok, "error": self.error, "reports": self.reports}
        out.update(self.extra)
        return out


def finish(entries: Sequence[DeviceEntry], *, as_json: bool, render: Callable[[DeviceEntry], list[str]]) -> None:
    """Print the per-device result (table or JSON) and exit with the worst device's code."""
    code = worst_exit_code([e.exit_code for e in entries])
    if as_json:
        doc = {"passed": code == 0, "devices": [e.to_dict() for e in entries]}
        click.echo(json.dumps(doc, indent=2))
    else:
        for entry in entries:
            mark = "ok    " if entry.ok else "FAILED"
            click.echo(f"{mark} {entry.device}")
            for line in render(entry):
                click.echo(f"       {line}")
            if entry.error:
                click.echo(f"error: {entry.error}", err=True)
        failed = [e for e in entries if not e.ok]
        if len(entries) > 1:
            click.echo(f"{len(entries) - len(failed)} of {len(entries)} devices succeeded", err=True)
    sys.stdout.flush()
    if code:
        raise SystemExit(code)


def entries_with(result: FleetResult[Any], key: str) -> list[DeviceEntry]:
    """One entry per device, its task's value (when it has one) under ``extra[key]``."""
    entries = []
    for outcome in result.outcomes:
        entry = DeviceEntry(outcome.device, outcome.ok, outcome.error, outcome.exit_code)
        if outcome.value is not None:
            entry.extra[key] = outcome.value
        entries.append(entry)
    return entries
