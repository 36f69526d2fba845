"""``edgetk devices probe --device SPEC... [--json]``: what a device is and what it can run.

The probe copies the runner to ``~/.edgetk/runner/edgetk_runner.py`` (only when its hash differs) and runs
``edgetk_runner.py probe`` with the device's Python (stdlib only, so it works before numpy is installed). It
adds the shipped target profile that matches best (``toolkit.targets.match_profile``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from toolkit.cli._fleet import DeviceEntry, device_options, finish, resolve_devices
from toolkit.devices.spec import DeviceSpec

RUNNER_DIR = ".edgetk/runner"


def _best_profile(env: dict[str, Any]) -> tuple[str | None, str | None]:
    try:
        from toolkit.targets import match_profile
    except ImportError:
        return None, "target profiles are not available in this install"
    try:
        return match_profile(arch=str(env.get("arch")), cpu_model=env.get("cpu_model"),
                             model_name=env.get("device_model")), None
    except Exception as exc:  # no profile for this device is an answer, not a failure
        return None, str(getattr(exc, "message", exc))


def probe_device(device: Any) -> dict[str, Any]:
    """Install the runner if needed and run its probe; returns the runner's document plus ``profile``."""
    import json

    from toolkit.bundle import RUNNER_SOURCE
    from toolkit.errors import DeviceError

    local = Path(RUNNER_SOURCE)
    digest = hashlib.sha256(local.read_bytes()).hexdigest()
    remote = f"{RUNNER_DIR}/edgetk_runner.py"
    python = device.python
    check = device.conn.run(
        [python, "-c",
         "import hashlib,os,sys\nos.makedirs(sys.argv[1],0o755,exist_ok=True)\n"
         "p=os.path.join(sys.argv[1],'edgetk_runner.py')\n"
         "print(hashlib.sha256(open(p,'rb').read()).hexdigest() if os.path.isfile(p) else '')",
         RUNNER_DIR],
        timeout=60,
    )
    if not check.ok:
        raise DeviceError(f"{device.spec.name}: cannot run {python!r} on the device ({check.stderr.strip()[-200:]}).",
                          hint="Install python3 there, or set `python` for it in the inventory.")
    if check.stdout.strip() != digest:
        device.conn.put(local, remote)
    result = device.conn.run([python, remote, "probe"], timeout=120)
    try:
        doc = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise DeviceError(f"{device.spec.name}: the probe printed no JSON ({result.stderr.strip()[-200:]}).") from None
    profile, why = _best_profile(doc.get("environment") or {})
    doc["profile"] = profile
    if why:
        doc["profile_note"] = why
    return dict(doc)


@click.group()
def devices() -> None:
    """Inspect devices."""


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

    result = selection.run(task)
    entries = []
    for outcome in result.outcomes:
        entry = DeviceEntry(outcome.device, outcome.ok, outcome.error, outcome.exit_code)
        if outcome.value is not None:
            entry.extra["probe"] = outcome.value
        entries.append(entry)

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
