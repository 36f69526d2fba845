"""``edgetk devices probe|setup``: what a device is and what it can run, and a venv with its runtimes
(``toolkit.api.probe`` / ``toolkit.api.setup``).

The probe copies the runner to ``~/.edgetk/runner/edgetk_runner.py`` (only when its hash differs) and runs
``edgetk_runner.py probe`` with the device's Python (stdlib only, so it works before numpy is installed). It
adds the shipped target profile that matches best (``toolkit.targets.match_profile``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from toolkit.cli._fleet import finish
from toolkit.cli.options import LazyChoice, device_options, json_option
from toolkit.options import vocabulary


@click.group()
def devices() -> None:
    """Inspect devices and set up their runtimes."""


def _render_probe(entry: Mapping[str, Any]) -> list[str]:
    doc = entry.get("probe")
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


@devices.command()
@device_options
@json_option
def probe(as_json: bool, **values: Any) -> None:
    """Arch, OS, CPU, memory, free disk, Python, runtimes and the matching target profile of each device."""
    from toolkit import api

    finish(api.probe(**values), as_json=as_json, render=_render_probe)


def _render_setup(entry: Mapping[str, Any]) -> list[str]:
    doc = entry.get("setup")
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


@devices.command()
@device_options
@click.option("--runtime", "runtimes", multiple=True, type=LazyChoice(vocabulary("RUNTIMES")),
              help="Runtime to install (repeatable); default: the ones the device's target profile runs.")
@click.option("--offline", is_flag=True,
              help="The device has no internet: download wheels for it on this machine and push them.")
@click.option("--venv", "venv", default=None, metavar="PATH",
              help="Where the virtual environment goes on the device (default ~/.edgetk/venv).")
@click.option("--target", default=None, metavar="NAME",
              help="Target profile whose runtime versions to install (default: the inventory's, else the probed "
              "match).")
@json_option
def setup(as_json: bool, **values: Any) -> None:
    """Create a venv on each device with numpy and its runtimes, and make deploys and checks use it.

    Offline, wheels for the device's platform (arch, glibc, Python) are downloaded here, cached under
    $XDG_CACHE_HOME/edgetk/wheels/, pushed over SSH and installed with --no-index.
    """
    from toolkit import api

    report = api.setup(progress=lambda line: click.echo(line, err=True), **values)
    finish(report, as_json=as_json, render=_render_setup)
