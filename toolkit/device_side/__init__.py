"""Everything that runs ON the device, in one place.

Each file here is a standalone script (Python >= 3.6, stdlib + numpy + one runtime at most, vermin-checked) that
the host copies to the device and runs with the device's own Python; nothing in the toolkit imports them:

- ``edgetk_runner.py``: the on-device runner, copied into every bundle (probe, check, run-one);
- ``device_helper.py``: the deploy helper (install, verify, switch, rollback, status), installed once per
  device under ``~/.edgetk/helper/`` keyed by its hash;
- ``device_probe.py``: the one device probe (arch, CPU, board, Python, glibc, memory, clocks). The runner and
  the helper carry verbatim copies of its block (a test keeps them identical); setup runs it as it is, and
  ``toolkit.model.platform.probe_local`` loads it in-process for this machine (it is stdlib-only);
- ``device_setup.py``: the device's steps of ``edgetk devices setup`` (the venv, the pushed wheels, the import
  check, the recorded python), run as ``python -c`` before anything is installed there.

The host reads them as text through :func:`source_path`.
"""

from __future__ import annotations

from pathlib import Path

DEVICE_SIDE_DIR = Path(__file__).resolve().parent
RUNNER_FILE = "edgetk_runner.py"
HELPER_FILE = "device_helper.py"
PROBE_FILE = "device_probe.py"
SETUP_FILE = "device_setup.py"


def source_path(name: str) -> Path:
    """The path of one device-side file shipped inside the package."""
    return DEVICE_SIDE_DIR / name
