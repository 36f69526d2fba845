"""``edgetk devices probe --device SPEC... [--json]``: what a device is and what it can run.

The probe copies the runner to ``~/.edgetk/runner/edgetk_runner.py`` (only when its hash differs) and runs
``edgetk_runner.py probe`` with the device's Python (stdlib only, so it works before numpy is installed). It
adds the shipped target profile that matches best (``toolkit.targets.match_profile``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from toolkit.cli._fleet import DeviceEntry, device_options, entries_with, finish, resolve_devices
from toolkit.devices.probe import probe_device
from toolkit.devices.spec import DeviceSpec
from toolkit.types import RUNTIMES

RUNTIME_CHOICES = RUNTIMES


@click.group()
def devices() -> None:
    """Inspect devices and set up their runtimes."""


@devices.command()
@device_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def probe(devices: Sequence[str], inventory: Path | None, group: str | None, parallel: int, trust_new_host: bool,
          known_hosts: Path | None, as_json: bool) -> None:
    """Arch, OS, CPU, memory, free disk, Python, runtimes and the matching target profile of each device."""
    from toolkit.deployment import Device

    selection = resolve_devices(devices, inventory, group, parallel, trust_new_host, known_hosts)

    def task(spec: DeviceSpec) -> dict[str, Any]:
        with selection.open(spec) as conn:
            return probe_device(Device(spec, conn))

    entries = entries_with(selection.run(task), "probe")

    def render(entry: DeviceEntry) -> list[str]:
        doc = entry.extra.get("probe")
        if not doc:
            return []
        env = doc.get("environment") or {}
        runtimes = ", ".join(f"{k} {v}" for k, v in (doc.get("runtimes") or {}).items() if v) or "none"
        return [
            f"{env.get('arch')}  {env.get('os')}  kernel {env.get('kernel')}",
            f"cpu {env.get('cpu_model')} x{env.get('cores')}  {env.get('device_model') or ''}".rstrip(),
            f"memory {env.get('memory_mb')} MB  free disk {env.get('free_disk_mb')} MB  python {env.get('python')}",
            f"runtimes: {runtimes}",
            f"profile: {doc.get('profile') or 'none'}" + (f" ({doc['profile_note']})" if doc.get("profile_note") else ""),
        ]

    finish(entries, as_json=as_json, render=render)


@devices.command()
@device_options
@click.option("--runtime", "runtimes", multiple=True, type=click.Choice(list(RUNTIME_CHOICES)),
              help="Runtime to install (repeatable); default: the ones the device's target profile runs.")
@click.option("--offline", is_flag=True,
              help="The device has no internet: download wheels for it on this machine and push them.")
@click.option("--venv", "venv", default=None, metavar="PATH",
              help="Where the virtual environment goes on the device (default ~/.edgetk/venv).")
@click.option("--target", default=None, metavar="NAME",
              help="Target profile whose runtime versions to install (default: the inventory's, else the probed "
              "match).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def setup(devices: Sequence[str], inventory: Path | None, group: str | None, parallel: int, trust_new_host: bool,
          known_hosts: Path | None, runtimes: Sequence[str], offline: bool, venv: str | None, target: str | None,
          as_json: bool) -> None:
    """Create a venv on each device with numpy and its runtimes, and make deploys and checks use it.

    Offline, wheels for the device's platform (arch, glibc, Python) are downloaded here, cached under
    $XDG_CACHE_HOME/edgetk/wheels/, pushed over SSH and installed with --no-index.
    """
    from toolkit.deployment import Device
    from toolkit.provisioning import DEFAULT_VENV, SetupOptions, setup_device

    selection = resolve_devices(devices, inventory, group, parallel, trust_new_host, known_hosts)
    if target:
        from toolkit.targets import get_profile

        get_profile(target)  # an unknown name is a usage error before any device is touched
    options = SetupOptions(runtimes=tuple(runtimes), offline=offline, venv=_venv_path(venv or DEFAULT_VENV),
                           target=target)

    def task(spec: DeviceSpec) -> dict[str, Any]:
        def log(line: str) -> None:
            click.echo(f"{spec.name}: {line}", err=True)

        with selection.open(spec) as conn:
            return setup_device(Device(spec, conn), options, log=log).to_dict()

    entries = entries_with(selection.run(task), "setup")

    def render(entry: DeviceEntry) -> list[str]:
        doc = entry.extra.get("setup")
        if not doc:
            return []
        installed = ", ".join(f"{k} {v}" for k, v in doc["installed"].items())
        lines = [
            f"{doc['platform']}  profile {doc.get('profile') or 'none'}",
            f"python {doc['python']} ({'reused' if doc['venv_reused'] else 'created'}, {doc['mode']})",
            f"installed: {installed}",
        ]
        if doc["mode"] == "offline":
            lines.append(f"wheels sent: {doc['wheels_sent']} ({doc['bytes_sent'] / 1e6:.1f} MB) "
                         f"in {doc['seconds']:.1f} s")
        lines += [f"note: {n}" for n in doc.get("notes", [])]
        return lines

    finish(entries, as_json=as_json, render=render)


def _venv_path(text: str) -> str:
    """``~/x`` and relative paths are relative to the device user's home (the remote working directory)."""
    from toolkit.errors import UsageError

    text = text.strip()
    if not text or "\x00" in text:
        raise UsageError("--venv needs a path.", hint="For example --venv ~/.edgetk/venv-legacy.")
    if text == "~":
        raise UsageError("--venv ~ would turn the home directory into a venv.", hint="Name a directory below it.")
    return text.removeprefix("~/")
