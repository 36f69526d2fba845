"""``devices setup`` failures that name their fix, against the Dropbear stand-in (tests/fixtures/dropbear.py).

Debian's python3 without ``python3-venv`` (its ``ensurepip`` hidden under an empty tmpfs in the stand-in's mount
namespace; the device envs are made from Debian's python3, so this is Debian's own venv code): ``python -m venv``
prints why on STDOUT and exits 1, leaving a venv without pip. Before: "could not create the venv (no output).
Check the path and the free disk", the half-made venv left behind, and the next run "No module named pip".
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.cli import run_edgetk
from tests.fixtures.dropbear import DropbearDevice
from tests.fixtures.home import Home

pytestmark = pytest.mark.dropbear


def test_no_ensurepip_names_python3_venv_and_offline_and_leaves_no_venv(
        fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path, tmp_path: Path) -> None:
    device = fresh_dropbear_device(home_mb=16, no_ensurepip=True)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    shutil.copy(dropbear_client_key, home / ".ssh" / "id_ed25519")
    (home / ".ssh" / "id_ed25519").chmod(0o600)
    (home / ".ssh" / "known_hosts").write_text(device.known_hosts_line())
    env = {**Home(home).env, "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}
    for attempt in range(2):  # the second run meets the same fix, not "No module named pip"
        setup = run_edgetk("devices", "setup", "--device", device.spec, "--runtime", "onnxruntime", "--json",
                           env=env)
        assert setup.code == 4, setup.stdout + setup.stderr
        error = setup.json()["devices"][0]["error"]
        assert "no ensurepip" in error and "apt install python3-venv" in error and "--offline" in error, error
        assert "No module named pip" not in error
        (said,) = [line for line in setup.stderr.splitlines() if line.startswith("error: ")]
        assert said.count(device.spec) == 1, said  # the device named once ("error: pi-1: pi-1: ..." before)
        assert not (device.home / ".edgetk" / "venv").exists(), f"attempt {attempt}: a half-made venv was left"
