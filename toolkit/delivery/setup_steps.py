"""How the host runs one step of ``device_side/device_setup.py`` on a device and reads its answer (the setup
and the native ``.pte`` runner's install share them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from toolkit.device_side import PROBE_FILE, SETUP_FILE, source_path
from toolkit.errors import DeviceError

if TYPE_CHECKING:
    from toolkit.delivery.deployment import Device


def probe_script() -> str:
    """The device probe's source, run as ``python -c`` (setup runs before anything is installed there)."""
    return source_path(PROBE_FILE).read_text()


def setup_step(python: str, command: str, *args: str) -> list[str]:
    """The argv of one step of ``device_side/device_setup.py``, run as ``python -c``."""
    return [python, "-c", source_path(SETUP_FILE).read_text(), command, *args]


def run_json(  # Any: the step's JSON, read by key
    device: Device, argv: Sequence[str], what: str, *, timeout: float = 120.0
) -> dict[str, Any]:
    """The JSON document a device-side step printed last (raw data: Any at that boundary)."""
    result = device.conn.run(list(argv), timeout=timeout)
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1]) if result.ok and result.stdout.strip() else None
    except (json.JSONDecodeError, IndexError):
        data = None
    if not isinstance(data, dict):
        tail = (result.stderr.strip().splitlines() or [result.stdout.strip() or "no output"])[-1][:300]
        raise DeviceError(f"{device.spec.name}: {what} failed on the device ({tail}).")
    return data
