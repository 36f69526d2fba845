"""A device that stops answering while its kernel still ACKs TCP: SIGSTOP of the session's sshd processes (what
a hung SD card or an OOM-thrashing board looks like from the network). TCP_USER_TIMEOUT cannot notice (the link
is fine); the connection's keepalive watchdog must, whatever step the tool is in: mid-upload, mid-check, and in
a fleet where the other devices finish. Figures are printed (run with -s).

The watchdog is set short here, as a user would set it (``ServerAliveInterval 1``, ``ServerAliveCountMax 4``
in the HOME's ``~/.ssh/config``): a freeze is declared after ~4 s instead of the shipped ~12 s (3 s x 4), which
is what these tests wait for. The shipped defaults keep their proof in tests/faults/test_network.py (the link
cut, whose TCP_USER_TIMEOUT derives from them) and the frozen login here (the shipped ConnectTimeout), and
tests/devices/test_ssh_config.py proves that the settings drive the watchdog.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.conftest import NO_GATES, Field, _size, _wait_for, deploy_and_check
from tests.fixtures.cli import REPO, run_edgetk
from tests.fixtures.deploy_helpers import write_inventory
from tests.fixtures.frozen import frozen
from tests.fixtures.home import Home, new_home
from toolkit.delivery.bundle import read_bundle

pytestmark = [pytest.mark.ssh]
FROZEN_FAIL_LIMIT_S = 60.0  # the contract: a frozen device fails within 60 s (the watchdog's default is ~20 s)


def short_keepalives(home: Path) -> None:
    """``~/.ssh/config`` in ``home``: every device's keepalive watchdog declares a freeze after ~4 s."""
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "config").write_text("Host *\n  ServerAliveInterval 1\n  ServerAliveCountMax 4\n")


def _runner_pids(name: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"edgetk_runner.py" in cmdline and f"bundles/{name}/".encode() in cmdline:
                pids.append(int(entry))
    return pids


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.netns
def test_device_frozen_mid_upload_fails_keeps_current_and_resumes(field: Field, deploy_bundle_factory) -> None:  # type: ignore[no-untyped-def]
    lab = field.lab
    lab.reset()
    short_keepalives(Path(field.env["HOME"]))
    v1 = deploy_bundle_factory(name="frozen", seed=71)
    v2 = deploy_bundle_factory(name="frozen", seed=72, pad_mb=12)
    deploy_and_check(field, v1)
    b1, b2 = read_bundle(v1), read_bundle(v2)
    partial = field.bundles / "frozen" / b2.version / "model.fp32.onnx"
    assert lab.device.process is not None
    lab.rate(10)  # 12 MB at 10 Mbit/s: about 10 s, time to freeze it in the middle
    proc = lab.popen_cli("deploy", v2, "--inventory", field.inventory, env=field.env)
    try:
        _wait_for(lambda: _size(partial) >= 2_000_000, timeout=60, what="the upload to reach 2 MB")
        with frozen(lab.device.process.pid):
            frozen_at = time.monotonic()
            _, stderr = proc.communicate(timeout=120)
            to_fail = time.monotonic() - frozen_at
            # still frozen: nothing could have switched `current`
            assert os.readlink(field.bundles / "frozen" / "current") == b1.version
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lab.reset()
    print(f"\nFIGURE frozen mid-upload: the deploy failed {to_fail:.1f} s after the freeze")
    assert proc.returncode == 4, stderr
    assert "the device stopped answering" in stderr, stderr
    assert "no reply to 4 keepalives" in stderr, stderr  # the user's setting, not the shipped 3 s x 4
    assert "Traceback" not in stderr
    assert to_fail < FROZEN_FAIL_LIMIT_S, to_fail

    # thawed: the re-run resumes the cut-short file and switches
    again = lab.cli("deploy", v2, "--inventory", field.inventory, "--json", env=field.env)
    assert again.code == 0, again.stderr
    push = again.json()["devices"][0]["deploy"]
    assert push["bytes_resumed"] >= 2_000_000, push
    assert os.readlink(field.bundles / "frozen" / "current") == b2.version
    print(f"FIGURE re-run after the thaw: {push['bytes_sent'] / 1e6:.2f} MB sent, "
          f"{push['bytes_resumed'] / 1e6:.2f} MB resumed")


@pytest.mark.netns
def test_device_frozen_mid_check_fails_and_records_nothing(field: Field, deploy_bundle_factory) -> None:  # type: ignore[no-untyped-def]
    lab = field.lab
    lab.reset()
    short_keepalives(Path(field.env["HOME"]))
    bundle = deploy_bundle_factory(name="frozen-check", seed=73)
    deploy_and_check(field, bundle)
    before = run_edgetk("history", "--bundle", "frozen-check", "--json", env=field.env).json()
    assert lab.device.process is not None
    proc = lab.popen_cli("check", bundle, "--inventory", field.inventory, *NO_GATES, "--runs", "5000000",
                         "--warmup", "0", "--json", env=field.env)
    try:
        _wait_for(lambda: bool(_runner_pids("frozen-check")), timeout=60, what="the runner to start")
        with frozen(lab.device.process.pid):
            frozen_at = time.monotonic()
            stdout, stderr = proc.communicate(timeout=120)
            to_fail = time.monotonic() - frozen_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill(_runner_pids("frozen-check"))
    print(f"\nFIGURE frozen mid-check: failed {to_fail:.1f} s after the freeze")
    assert proc.returncode == 4, (stdout, stderr)
    (entry,) = json.loads(stdout)["devices"]
    assert entry["ok"] is False and entry["reports"] == []
    assert "the device stopped answering" in entry["error"], entry["error"]
    assert "no reply to 4 keepalives" in entry["error"], entry["error"]
    assert to_fail < FROZEN_FAIL_LIMIT_S
    assert run_edgetk("history", "--bundle", "frozen-check", "--json", env=field.env).json() == before


def test_frozen_device_in_a_fleet_is_reported_and_the_others_finish(fresh_ssh_device, ssh_client_key,  # type: ignore[no-untyped-def]
                                                                     ssh_known_hosts, device_env,
                                                                     deploy_bundle_factory, tmp_path):
    healthy, stuck = fresh_ssh_device(), fresh_ssh_device()
    inventory = write_inventory(tmp_path / "inv.toml", [healthy, stuck], python=str(device_env.python),
                                key=ssh_client_key, known_hosts=ssh_known_hosts(healthy, stuck),
                                names=["healthy", "stuck"])
    home = new_home(tmp_path).path
    short_keepalives(home)
    env = Home(home).env
    bundle = deploy_bundle_factory(name="fleet-frozen", seed=74)
    # long enough on both that `stuck` is caught mid-check; `healthy` then finishes its runs
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "deploy", str(bundle), "--inventory", str(inventory), "--check",
         *NO_GATES, "--runs", "20000", "--warmup", "0", "--json"],
        cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert stuck.process is not None
    try:
        _wait_for(lambda: any(_cwd(p) == str(stuck.home) for p in _runner_pids("fleet-frozen")),
                  timeout=90, what="the runner to start on the stuck device")
        with frozen(stuck.process.pid):
            stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill(_runner_pids("fleet-frozen"))
    assert proc.returncode == 4, stderr
    by_name = {d["device"]: d for d in json.loads(stdout)["devices"]}
    assert by_name["healthy"]["ok"] is True, by_name["healthy"]
    assert by_name["healthy"]["reports"][0]["outputs_match"]["ok"]
    assert by_name["stuck"]["ok"] is False
    assert "the device stopped answering" in by_name["stuck"]["error"], by_name["stuck"]


@pytest.mark.timing
def test_a_frozen_sshd_at_login_is_named_not_waited_for(fresh_ssh_device, ssh_client_key, ssh_known_hosts,  # type: ignore[no-untyped-def]
                                                        device_env, deploy_bundle_factory, tmp_path):
    """The whole sshd frozen, listener included: the kernel still completes the TCP handshake, no greeting."""
    dev = fresh_ssh_device()
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=str(device_env.python), key=ssh_client_key,
                                known_hosts=ssh_known_hosts(dev), names=["asleep"])
    env = Home(tmp_path).env
    assert dev.process is not None
    os.kill(dev.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        result = run_edgetk("deploy", deploy_bundle_factory(name="asleep"), "--inventory", inventory, env=env,
                            timeout=120)
        took = time.monotonic() - started
    finally:
        os.kill(dev.process.pid, signal.SIGCONT)
    print(f"\nFIGURE frozen sshd at login: failed after {took:.1f} s")
    assert result.code == 4, result.stderr
    assert "the device stopped answering" in result.stderr and "no SSH greeting" in result.stderr
    assert "Traceback" not in result.stderr and took < FROZEN_FAIL_LIMIT_S
