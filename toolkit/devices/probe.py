"""What a device is and what it can run: the runner's ``probe`` on the device, plus the shipped target
profile that matches best (``toolkit.model.platform.match_environment``).

The probe copies the runner to ``~/.edgetk/runner/edgetk_runner.py`` (only when its hash differs) and runs
``edgetk_runner.py probe`` with the device's Python (stdlib only, so it works before numpy is installed).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from toolkit.device_side import RUNNER_FILE, source_path
from toolkit.device_side.shared import sha256_file
from toolkit.devices.connection import Connection
from toolkit.devices.spec import DeviceSpec
from toolkit.errors import DeviceError, UsageError

RUNNER_DIR = ".edgetk/runner"


class ProbedDevice(Protocol):
    """What the probe reads of a device (``toolkit.delivery.deployment.Device``, a floor above)."""

    spec: DeviceSpec
    conn: Connection

    @property
    def python(self) -> str: ...


def _best_profile(env: dict[str, Any]) -> tuple[str | None, str | None]:  # Any: JSON
    from toolkit.model.platform import match_environment

    try:
        return match_environment(env), None
    except UsageError as exc:  # no profile for this device is an answer, not a failure
        return None, exc.message


def probe_device(device: ProbedDevice) -> dict[str, Any]:  # Any: JSON
    """Install the runner if needed and run its probe; returns the runner's document plus ``profile``."""
    local = source_path(RUNNER_FILE)
    digest = sha256_file(str(local))
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
    sftp = getattr(device.conn, "sftp_available", None)
    if callable(sftp):  # asked once per device and remembered (toolkit.devices.host_facts)
        doc["sftp"] = bool(sftp())
    if why:
        doc["profile_note"] = why
    return dict(doc)
