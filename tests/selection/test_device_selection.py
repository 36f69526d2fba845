"""The device chooses, on real devices: the ``local`` device, a loopback SSH x86 device (tests/fixtures/sshd.py)
and (tests/arm/test_emulated_pi.py) the emulated aarch64 Pi each select the artifact by their own check, not by
the manifest's proposal. The bundle (tests/fixtures/selection.py) proposes a TFLite that is several times slower
than the ONNX beside it, and the ONNX is the larger file, so the smaller-wins tie rule cannot pick it either:
a device that selects the ONNX selected by its measurements. A pinned selection survives a re-check; a device
env without onnxruntime (the legacy env: tflite-runtime only) moves the selection to the TFLite; a device with
no runtime at all selects nothing and says why (exit 1).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cli import run_edgetk
from tests.fixtures.selection import selection_bundle
from tests.fixtures.home import Home, new_home

FAST, SLOW = "model.fp32.onnx", "model.fp32.tflite"
CHECK = ("--runs", "15", "--warmup", "2", "--baseline", "none", "--budget-ms", "60000")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return selection_bundle(tmp_path_factory.mktemp("selection") / "choose")


def _local_inventory(path: Path, python: Path) -> Path:
    path.write_text(f'[devices.here]\nhost = "local"\npython = "{python}"\n')
    return path


def _selected(doc: dict[str, Any]) -> dict[str, Any]:
    (entry,) = doc["devices"]
    return dict(entry["selected"])


def _follows_the_numbers(selected: dict[str, Any]) -> None:
    """The selection is the fastest by the device's own p50s, against the manifest's proposal."""
    p50 = {c["artifact"]: c["p50_ms"] for c in selected["contenders"]}
    assert selected["proposed"] == SLOW and selected["artifact"] == FAST, selected
    assert p50[FAST] < p50[SLOW], p50
    assert selected["p50_ms"] == p50[FAST]


@pytest.mark.timing
def test_local_device_selects_by_its_own_measurements_and_a_pin_survives(bundle: Path, device_env: Any,
                                                                         tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = Home(home).env
    inventory = _local_inventory(tmp_path / "inv.toml", device_env.python)
    deployed = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *CHECK, "--json", env=env)
    assert deployed.code == 0, deployed.stdout + deployed.stderr
    selected = _selected(deployed.json())
    _follows_the_numbers(selected)
    assert selected["pinned"] is False and selected["changed"] is True

    # on the device: selected.json beside `current`, and the runner's one-line lookup gives the file's path
    bdir = home / ".edgetk" / "bundles" / "choose"
    on_device = json.loads((bdir / "selected.json").read_text())
    assert on_device["artifact"] == FAST and on_device["path"] == f"{on_device['version']}/{FAST}"
    lookup = subprocess.run([str(device_env.python), "-c", "import edgetk_runner; print(edgetk_runner.selected_model("
                             "'choose'))"], cwd=bdir / "current", env={**os.environ, **env}, capture_output=True,
                            text=True, timeout=60, check=True)
    assert Path(lookup.stdout.strip()) == (bdir / on_device["version"] / FAST)

    # status, report (terminal, --json, HTML) and the text of check show it
    status = run_edgetk("status", "--inventory", inventory, "--json", env=env)
    assert status.json()["devices"][0]["bundles"]["choose"]["selected"]["artifact"] == FAST
    assert f"selected: {FAST}" in run_edgetk("status", "--inventory", inventory, env=env).stdout
    report = run_edgetk("report", bundle, "--json", env=env).json()
    assert [(s["device"], s["artifact"]) for s in report["selected"]] == [("here", FAST)]
    html = tmp_path / "r.html"
    assert run_edgetk("report", bundle, "--html", html, env=env).code == 0
    assert 'id="selected"' in html.read_text() and FAST in html.read_text()

    # a pin, and a re-check that keeps it
    pinned = run_edgetk("check", bundle, "--inventory", inventory, *CHECK, "--select", SLOW, "--json", env=env)
    assert pinned.code == 0, pinned.stderr
    assert _selected(pinned.json())["artifact"] == SLOW and _selected(pinned.json())["pinned"] is True
    again = run_edgetk("check", bundle, "--inventory", inventory, *CHECK, env=env)
    assert again.code == 0, again.stderr
    assert f"selected: {SLOW}" in again.stdout and "[pinned]" in again.stdout
    assert json.loads((bdir / "selected.json").read_text())["artifact"] == SLOW
    bad = run_edgetk("check", bundle, "--inventory", inventory, *CHECK, "--select", "model.int8.tflite", env=env)
    assert bad.code == 2 and "no artifact of that name" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.timing
def test_a_runtime_removed_from_the_device_moves_the_selection(bundle: Path, device_env: Any, legacy_env: Any,
                                                               bare_env: Any, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = Home(home).env
    full = run_edgetk("deploy", bundle, "--inventory", _local_inventory(tmp_path / "a.toml", device_env.python),
                      "--check", *CHECK, "--json", env=env)
    assert full.code == 0, full.stderr
    assert _selected(full.json())["artifact"] == FAST
    # the same device, its onnxruntime gone (tflite-runtime only): the check fails the ONNX (it cannot run) and
    # the selection moves to the TFLite
    legacy = run_edgetk("check", bundle, "--inventory", _local_inventory(tmp_path / "b.toml", legacy_env.python),
                        *CHECK, "--json", env=env)
    moved = _selected(legacy.json())
    assert moved["artifact"] == SLOW and moved["changed"] is True, moved
    assert set(moved["runtimes"]) == {"tflite-runtime"}
    excluded = {c["artifact"]: c["excluded"] for c in moved["contenders"]}
    assert excluded[FAST].startswith("the device cannot run it") and excluded[SLOW] is None
    assert legacy.code == 1  # the ONNX artifact's check failed there
    # no runtime at all: nothing is selected, and the device says why
    bare = run_edgetk("check", bundle, "--inventory", _local_inventory(tmp_path / "c.toml", bare_env.python),
                      *CHECK, "--json", env=env)
    assert bare.code == 1
    nothing = _selected(bare.json())
    assert nothing["artifact"] is None and "no artifact passes on this device" in nothing["reason"]
    assert "nothing selected" in bare.json()["devices"][0]["error"]
    assert json.loads((home / ".edgetk" / "bundles" / "choose" / "selected.json").read_text())["artifact"] is None


@pytest.mark.timing
@pytest.mark.ssh
def test_loopback_ssh_device_selects_by_its_own_measurements(bundle: Path, ssh_devices: Any, ssh_client_key: Path,
                                                            ssh_known_hosts: Any, device_env: Any,
                                                            tmp_path: Path) -> None:
    (device,) = ssh_devices(1)
    inventory = tmp_path / "ssh.toml"
    inventory.write_text(device.inventory_entry(name="x86", identity_file=str(ssh_client_key),
                                                known_hosts=str(ssh_known_hosts(device)),
                                                python=str(device_env.python)))
    result = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *CHECK, "--json",
                        env=new_home(tmp_path).env)
    assert result.code == 0, result.stdout + result.stderr
    _follows_the_numbers(_selected(result.json()))
