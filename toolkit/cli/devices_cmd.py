"""``edgetk devices probe|setup|add-key``: what a device is and what it can run, a venv with its runtimes, and
the user's key on a first-boot device (``toolkit.api.probe`` / ``setup`` / ``add_key``; how the probe works:
``toolkit.devices.probe``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # Any: click's parsed values

import click

from toolkit.cli._fleet import finish
from toolkit.cli.options import LazyChoice, PathType, device_options, json_option
from toolkit.model.flags import vocabulary

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.api.results import DeviceResult
    from toolkit.model.answers import AddKeyAnswer, ProbeAnswer, SetupAnswer


@click.group()
def devices() -> None:
    """Inspect devices and set up their runtimes."""


def _render_probe(result: DeviceResult[ProbeAnswer]) -> list[str]:
    doc = result.answer.probe if result.answer is not None else None  # the runner's probe document
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


def _render_setup(result: DeviceResult[SetupAnswer]) -> list[str]:
    if result.answer is None:
        return []
    done = result.answer.setup
    installed = ", ".join(f"{k} {v}" for k, v in done.installed.items())
    lines = [
        f"{done.platform}  profile {done.profile or 'none'}",
        f"python {done.python} ({'reused' if done.venv_reused else 'created'}, {done.mode})",
        f"installed: {installed}",
    ]
    if done.mode == "offline":
        lines.append(f"wheels sent: {done.wheels_sent} ({done.bytes_sent / 1e6:.1f} MB) in {done.seconds:.1f} s")
    lines += [f"note: {n}" for n in done.notes]
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


def _render_add_key(result: DeviceResult[AddKeyAnswer]) -> list[str]:
    if result.answer is None:
        return []
    done = result.answer.add_key
    lines = [f"key {done.key} ({done.key_file})"]
    lines += [f"added to {f}" for f in done.added] + [f"already in {f}" for f in done.present]
    lines.append("key login works" if done.key_login else "key login FAILED")
    return lines


def _prompt() -> str:
    import getpass

    return getpass.getpass("Device login password (asked once for every device; not stored): ")


@devices.command("add-key")
@device_options
@click.option("--key", "public_key", type=PathType(), default=None, metavar="FILE.pub",
              help="Public key to install (default: the device's IdentityFile, else ~/.ssh/id_ed25519.pub, ...).")
@click.option("--password-file", "password_file", type=PathType(), default=None, metavar="FILE",
              help="Read the login password from this file's first line (for fleets and scripts).")
@click.option("--password-env", "password_env", default=None, metavar="VAR",
              help="Read the login password from this environment variable.")
@json_option
def add_key(as_json: bool, **values: Any) -> None:
    """Install your public key on first-boot devices over a password login, then check that key login works.

    The password is asked once on a terminal (or read from --password-file / --password-env), used for every
    device, and never logged or stored. Host keys are checked as always: a new one needs --trust-new-host.
    """
    import sys

    from toolkit import api

    ask = _prompt if sys.stdin.isatty() and not values.get("password_file") and not values.get("password_env") \
        else None
    finish(api.add_key(ask=ask, **values), as_json=as_json, render=_render_add_key)
