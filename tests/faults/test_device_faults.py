"""Device faults, injected for real: a full disk (a small tmpfs mounted as the device user's ~/.edgetk and filled
during the upload), a file corrupted on the device after deploy, and a runtime that crashes while checking.
Two deploys at once are covered by tests/test_deployment.py::test_ssh_push_concurrent_deploys_and_hostile_name
(the device lock serialises them; neither corrupts the other) and the lock of a deploy whose link was cut by
tests/faults/test_network.py.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from tests.faults.conftest import NO_GATES, Field, _size, _wait_for, deploy_and_check
from tests.fixtures.cli import assert_clean_error, run_edgetk
from tests.fixtures.deploy_helpers import write_inventory
from tests.fixtures.home import Home, new_home
from toolkit.delivery.bundle import read_bundle

pytestmark = [pytest.mark.ssh]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fill(directory: Path) -> Path:
    """Write until the filesystem says ENOSPC (what another process on a full SD card does)."""
    filler = directory / "filler.bin"
    block = b"\0" * (1 << 20)
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(block)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


@pytest.mark.netns
def test_disk_full_during_push_removes_partial_and_keeps_current(field: Field, deploy_bundle_factory) -> None:  # type: ignore[no-untyped-def]
    lab = field.lab
    lab.reset()
    dev = lab.device
    base = dev.home / ".edgetk"
    base.mkdir(exist_ok=True)
    user = pwd.getpwnam(dev.user)
    os.chown(base, user.pw_uid, user.pw_gid)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=12m,mode=0755,uid={user.pw_uid},gid={user.pw_gid}",
                    "edgetk-full", str(base)], check=True)
    # `ip netns exec` gives sshd a private copy of the mount table: restart it so it sees the small disk
    dev.kill_all()
    dev.start()
    try:
        v1 = deploy_bundle_factory(name="disk", seed=51)
        v2 = deploy_bundle_factory(name="disk", seed=52, pad_mb=4)
        b1, b2 = read_bundle(v1), read_bundle(v2)
        deploy_and_check(field, v1)
        partial = base / "bundles" / "disk" / b2.version / "model.fp32.onnx"

        lab.rate(10)  # slow enough to fill the disk while the artifact is on its way
        proc = lab.popen_cli("deploy", v2, "--inventory", field.inventory, env=field.env)
        try:
            _wait_for(lambda: _size(partial) >= 500_000, timeout=60, what="the upload to start")
            filler = _fill(base)
            _, stderr = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 4, stderr
        assert "disk is full" in stderr and "partial upload was removed" in stderr, stderr
        assert "Traceback" not in stderr
        assert not (base / "bundles" / "disk" / b2.version).exists()
        assert os.readlink(base / "bundles" / "disk" / "current") == b1.version
        assert not (base / "locks" / "disk").exists()

        # still full: refused before anything is sent, with what it needs
        lab.rate(None)
        refused = lab.cli("deploy", v2, "--inventory", field.inventory, env=field.env)
        assert_clean_error(refused, 4, "needs 4.0 MB free", "edgetk prune disk --device")  # not `edgetk remove`
        assert not (base / "bundles" / "disk" / b2.version).exists()

        filler.unlink()
        still = lab.cli("check", v1, "--inventory", field.inventory, *NO_GATES, "--runs", "3", env=field.env)
        assert still.code == 0, still.stderr
        deploy_and_check(field, v2, full=False)  # and with room again, it goes through
    finally:
        lab.reset()
        subprocess.run(["umount", "-l", str(base)], check=False)
        dev.kill_all()
        dev.start()


@pytest.fixture
def ssh_field(ssh_devices, ssh_client_key, ssh_known_hosts, device_env, tmp_path):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=str(device_env.python), key=ssh_client_key,
                                known_hosts=ssh_known_hosts(dev), names=["pi-1"])
    home = new_home(tmp_path).path
    return dev, inventory, Home(home).env


def test_corrupted_file_on_device_is_refused_by_check_and_repaired_by_deploy(ssh_field, deploy_bundle_factory) -> None:  # type: ignore[no-untyped-def]
    dev, inventory, env = ssh_field
    path = deploy_bundle_factory(name="corrupt", seed=61)
    bundle = read_bundle(path)
    first = run_edgetk("deploy", path, "--inventory", inventory, "--json", env=env)
    assert first.code == 0, first.stderr
    installed = dev.home / ".edgetk" / "bundles" / "corrupt" / "current" / "model.fp32.onnx"
    data = bytearray(installed.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit flipped by a failing SD card: the file still loads
    installed.write_bytes(bytes(data))

    checked = run_edgetk("check", path, "--inventory", inventory, *NO_GATES, "--json", env=env)
    assert checked.code == 1, checked.stderr
    (report,) = checked.json()["devices"][0]["reports"]
    assert report["error"]["kind"] == "integrity" and "sha256" in report["error"]["message"]
    assert report["latency_ms"] is None and report["outputs_match"] is None and report["runs"] == 0
    assert report["gates"]["passed"] is False

    repaired = run_edgetk("deploy", path, "--inventory", inventory, "--check", *NO_GATES, "--json", env=env)
    assert repaired.code == 0, repaired.stderr
    entry = repaired.json()["devices"][0]
    artifact = bundle.files()[0]
    assert entry["deploy"]["files_sent"] == 1 and entry["deploy"]["bytes_sent"] == artifact.bytes
    assert _sha(installed) == artifact.sha256
    assert entry["reports"][0]["error"] is None and entry["reports"][0]["outputs_match"]["ok"]


FAKE_ORT = """
import os, signal
__version__ = "0.0-crash"
def get_available_providers():
    return ["CPUExecutionProvider"]
class SessionOptions(object):
    pass
class InferenceSession(object):
    def __init__(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGSEGV)  # a native kernel bug, seen from outside
"""


def test_runtime_crash_is_reported_per_artifact(ssh_devices, ssh_client_key, ssh_known_hosts, device_env,  # type: ignore[no-untyped-def]
                                                tiny_bundle, tmp_path):
    """The device's onnxruntime segfaults: the onnx artifact reports a crash, the tflite ones still measure."""
    (dev,) = ssh_devices(1)
    fake = dev.workdir / "crashing_site" / "onnxruntime"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text(FAKE_ORT)
    wrapper = dev.workdir / "crashing_python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{fake.parent}" exec "{device_env.python}" "$@"\n')
    for p in (fake.parent, fake, fake / "__init__.py", wrapper):
        p.chmod(0o755)
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=str(wrapper), key=ssh_client_key,
                                known_hosts=ssh_known_hosts(dev), names=["crashy"])
    home = new_home(tmp_path).path
    env = Home(home).env
    started = time.monotonic()
    result = run_edgetk("deploy", tiny_bundle, "--inventory", inventory, "--check", *NO_GATES, "--runs", "5",
                        "--json", env=env)
    assert result.code == 1, result.stderr
    by_file = {r["artifact"]: r for r in result.json()["devices"][0]["reports"]}
    crash = by_file["model.fp32.onnx"]
    assert crash["error"]["kind"] == "crash" and "SIGSEGV" in crash["error"]["message"]
    assert crash["gates"]["passed"] is False and crash["latency_ms"] is None
    for name in ("model.fp32.tflite", "model.int8.tflite"):
        assert by_file[name]["error"] is None and by_file[name]["outputs_match"]["ok"], by_file[name]
        assert by_file[name]["gates"]["passed"]
    text = run_edgetk("check", tiny_bundle, "--inventory", inventory, *NO_GATES, "--runs", "5", env=env)
    assert text.code == 1 and "could not run (crash)" in text.stdout, text.stdout
    assert time.monotonic() - started < 120


def test_device_python_without_numpy_is_told_at_deploy(ssh_devices, ssh_client_key, ssh_known_hosts,  # type: ignore[no-untyped-def]
                                                       deploy_bundle_factory, tmp_path):
    """Debian's /usr/bin/python3 has no numpy (and `pip install numpy` is refused there as externally managed):
    deploy says so at once, with the command that fixes it."""
    (dev,) = ssh_devices(1)
    bare = "/usr/bin/python3"
    assert subprocess.run([bare, "-c", "import numpy"], capture_output=True).returncode != 0
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=bare, key=ssh_client_key,
                                known_hosts=ssh_known_hosts(dev), names=["bare-pi"])
    home = new_home(tmp_path).path
    env = Home(home).env
    result = run_edgetk("deploy", deploy_bundle_factory(name="nonumpy", seed=81), "--inventory", inventory, "--json",
                        env=env)
    assert result.code == 0, result.stderr  # the push itself needs no numpy
    assert "has no numpy" in result.stderr and "edgetk devices setup --device bare-pi" in result.stderr
    (warning,) = result.json()["devices"][0]["deploy"]["warnings"]
    assert "pip install" not in warning
