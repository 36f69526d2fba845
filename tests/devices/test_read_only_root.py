"""A device with a read-only root (OpenWrt's overlay, a Yocto read-only rootfs, Balena-like): the home is read-only,
``/data`` is the one writable place and ``/tmp`` a small tmpfs mounted noexec (the Dropbear stand-in of
tests/fixtures/dropbear.py with ``read_only_root=True``: bind mounts in its private mount namespace).

Before: every command exited 4 with "cannot create .edgetk/helper ... Read-only file system", nothing let the
toolkit's files go anywhere but ~/.edgetk, probe said "cannot run python", and ``setup --offline`` downloaded its
wheels before it found it could not write. Now probe says what to set, setup refuses before any download, and
with ``home = "/data/edgetk"`` (or --device-home) every command works there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cli import run_edgetk
from tests.fixtures.dropbear import DropbearDevice
from tests.fixtures.home import Home

pytestmark = pytest.mark.dropbear

NO_GATES = ("--budget-ms", "100000", "--baseline", "none")


def _env(tmp_path: Path, device: DropbearDevice, key: Path) -> dict[str, str]:
    home = tmp_path / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    shutil.copy(key, ssh / "id_ed25519")
    (ssh / "id_ed25519").chmod(0o600)
    (ssh / "known_hosts").write_text(device.known_hosts_line())
    return {**Home(home).env, "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}


def test_a_read_only_root_is_told_what_to_set_and_works_from_data(
        fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path,
        deploy_bundle_factory: Any, tmp_path: Path) -> None:
    device = fresh_dropbear_device(home_mb=8, read_only_root=True)
    env = _env(tmp_path, device, dropbear_client_key)

    probe = run_edgetk("devices", "probe", "--device", device.spec, "--json", env=env)
    assert probe.code == 4, probe.stdout + probe.stderr
    error = probe.json()["devices"][0]["error"]
    assert "read-only" in error and 'set home = "/data/edgetk"' in error, error
    assert "cannot run" not in error and "Traceback" not in probe.stderr

    # setup refuses before it downloads anything (no wheel in the cache), and says the same
    setup = run_edgetk("devices", "setup", "--device", device.spec, "--offline", "--runtime", "onnxruntime",
                       "--json", env=env)
    assert setup.code == 4, setup.stdout + setup.stderr
    assert "Read-only" in setup.json()["devices"][0]["error"]
    assert not list((tmp_path / "xdg-cache").rglob("*.whl"))

    # the venv never goes to a noexec place: refused before any download
    noexec = run_edgetk("devices", "setup", "--device", device.spec, "--device-home", "/data/edgetk", "--venv",
                        "/tmp/venv", "--offline", "--runtime", "onnxruntime", "--json", env=env)
    assert noexec.code == 4, noexec.stdout + noexec.stderr
    assert "/tmp/venv is on a filesystem mounted noexec" in noexec.json()["devices"][0]["error"]
    assert not list((tmp_path / "xdg-cache").rglob("*.whl"))

    # a python on the noexec /tmp: probe says it cannot execute it (not "cannot run python")
    stray = device.device_path("/tmp/python3")
    stray.write_text(f"#!/bin/busybox sh\nexec {device.env.python} \"$@\"\n")
    stray.chmod(0o755)
    try:
        inventory = tmp_path / "noexec.toml"
        inventory.write_text(device.inventory_entry(name="ro", home="/data/edgetk", python="/tmp/python3"))
        denied = run_edgetk("devices", "probe", "--inventory", inventory, "--json", env=env)
    finally:
        stray.unlink()
    assert denied.code == 4 and "cannot execute '/tmp/python3'" in denied.json()["devices"][0]["error"], denied.stdout

    # with home = "/data/edgetk": probe, deploy --check, status, rollback, prune, check, all under /data
    inventory = tmp_path / "inv.toml"
    inventory.write_text(device.inventory_entry(name="ro", home="/data/edgetk", target="generic-x86_64"))
    probe = run_edgetk("devices", "probe", "--inventory", inventory, "--json", env=env)
    assert probe.code == 0, probe.stderr
    found = probe.json()["devices"][0]["probe"]
    assert found["home"] == {"path": "/data/edgetk", "noexec": False}
    assert any("/tmp is mounted noexec" in note for note in found["notes"]), found
    v1 = deploy_bundle_factory(name="ro", seed=61)
    v2 = deploy_bundle_factory(name="ro", seed=62)
    for bundle in (v1, v2):
        result = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, "--json", env=env)
        assert result.code == 0, result.stderr
        assert result.json()["devices"][0]["reports"][0]["outputs_match"]["ok"]
    version1 = result.json()["devices"][0]["deploy"]["previous"]
    bundles = device.device_path("/data/edgetk/bundles/ro")
    assert (bundles / "selected.json").is_file()
    status = run_edgetk("status", "--inventory", inventory, "--json", env=env)
    assert status.code == 0 and "ro" in status.stdout, status.stderr
    back = run_edgetk("rollback", "ro", "--inventory", inventory, "--json", env=env)
    assert back.code == 0, back.stderr
    assert os.readlink(bundles / "current") == version1
    pruned = run_edgetk("prune", "ro", "--keep", "1", "--inventory", inventory, "--json", env=env)
    assert pruned.code == 0, pruned.stderr
    # --device-home names the same place for a device given by its spec
    again = run_edgetk("check", v1, "--device", device.spec, "--device-home", "/data/edgetk", *NO_GATES, env=env)
    assert again.code == 0, again.stdout + again.stderr
    assert not (device.home / ".edgetk").exists()
    assert not list(device.device_path("/tmp").iterdir())  # nothing was put in the noexec /tmp
