"""Deploy and check over a bad link, for real: a device in its own network namespace behind a veth whose
rate (tc tbf), loss (nftables) and delay (a user-space relay) we set, and which we cut (tests/fixtures/netns.py).
Every command is the real CLI run from the client namespace. Figures (push time per condition, time to fail on
a cut) are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from tests.faults.conftest import NO_GATES, Field, _size, _wait_for, deploy_and_check
from tests.fixtures.cli import run_edgetk
from tests.fixtures.netns import NetLab
from toolkit.delivery.bundle import read_bundle

pytestmark = [pytest.mark.netns, pytest.mark.ssh]
CUT_FAIL_LIMIT_S = 30.0


@pytest.fixture(autouse=True)
def _clean_link(netlab: NetLab):  # type: ignore[no-untyped-def]
    netlab.reset()
    yield
    netlab.reset()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("condition", ["10mbit", "loss5", "rtt100"])
def test_deploy_and_check_over_a_bad_link(field: Field, deploy_bundle_factory, condition: str) -> None:  # type: ignore[no-untyped-def]
    bundle = deploy_bundle_factory(name=f"link-{condition}", pad_mb=2, seed=40)
    lab = field.lab
    started = time.monotonic()
    if condition == "10mbit":
        lab.rate(10)
        push = deploy_and_check(field, bundle)
        # the link really was 10 Mbit/s: 2 MB cannot take less than 1.6 s
        assert push["seconds"] >= 1.5, push
    elif condition == "loss5":
        lab.loss(5)
        push = deploy_and_check(field, bundle)
    else:
        with lab.relay(0.05) as port:
            known = field.root / "known_hosts_relay"
            known.write_text(lab.device.known_hosts_line(port=port))
            inventory = lab.inventory(field.root / "inv_relay.toml", python=field.python, key=field.key,
                                      known_hosts=known, port=port)
            push = deploy_and_check(field, bundle, inventory=inventory)
            # the relay really delays: the whole deploy (dozens of round trips) cannot be fast
            assert time.monotonic() - started > 2.0
    print(f"\nFIGURE {condition}: push of {push['bytes_total'] / 1e6:.2f} MB in {push['seconds']:.2f} s "
          f"({push['bytes_total'] / 1e6 / push['seconds']:.2f} MB/s); deploy+check {time.monotonic() - started:.1f} s")


def test_link_cut_mid_push_fails_fast_keeps_current_and_resumes(field: Field, deploy_bundle_factory) -> None:  # type: ignore[no-untyped-def]
    lab = field.lab
    v1 = deploy_bundle_factory(name="cut", seed=21)
    v2 = deploy_bundle_factory(name="cut", seed=22, pad_mb=12)
    deploy_and_check(field, v1)
    b1, b2 = read_bundle(v1), read_bundle(v2)
    partial = field.bundles / "cut" / b2.version / "model.fp32.onnx"

    lab.rate(10)  # 12 MB at 10 Mbit/s: about 10 s, time to cut it in the middle
    proc = lab.popen_cli("deploy", v2, "--inventory", field.inventory, env=field.env)
    try:
        _wait_for(lambda: _size(partial) >= 2_000_000, timeout=60, what="the upload to reach 2 MB")
        lab.cut()
        cut_at = time.monotonic()
        _, stderr = proc.communicate(timeout=90)
        to_fail = time.monotonic() - cut_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"\nFIGURE link cut: the deploy failed {to_fail:.1f} s after the cut "
          f"({_size(partial) / 1e6:.1f} of {b2.files()[0].bytes / 1e6:.1f} MB on the device)")
    assert proc.returncode == 4, stderr
    assert "the link to the device dropped" in stderr, stderr
    assert "Traceback" not in stderr
    assert to_fail < CUT_FAIL_LIMIT_S, to_fail

    lab.restore()
    lab.rate(None)
    # the running version was never touched, and still runs
    assert os.readlink(field.bundles / "cut" / "current") == b1.version
    still = lab.cli("check", v1, "--inventory", field.inventory, *NO_GATES, "--runs", "3", "--json", env=field.env)
    assert still.code == 0, still.stderr
    assert still.json()["devices"][0]["reports"][0]["outputs_match"]["ok"]

    # the re-run sends only what is missing: the cut-short artifact resumes where it stopped
    started = time.monotonic()
    again = lab.cli("deploy", v2, "--inventory", field.inventory, "--json", env=field.env)
    assert again.code == 0, again.stderr
    push = again.json()["devices"][0]["deploy"]
    total = sum(f.bytes for f in b2.files())
    assert push["bytes_total"] == total
    assert push["bytes_resumed"] >= 2_000_000
    # files v1 already has (golden inputs, runner) are hard-linked on the device, not sent
    new = sum(f.bytes for f in b2.files() if f.sha256 not in {g.sha256 for g in b1.files()})
    assert push["bytes_sent"] == new - push["bytes_resumed"] < total
    assert os.readlink(field.bundles / "cut" / "current") == b2.version
    for f in b2.files():
        assert _sha(field.bundles / "cut" / "current" / f.path) == f.sha256
    print(f"FIGURE re-run after the cut: {push['bytes_sent'] / 1e6:.2f} MB sent, {push['bytes_resumed'] / 1e6:.2f} MB "
          f"resumed, {time.monotonic() - started:.1f} s (including waiting for the dead deploy's lock)")


def _runner_running(name: str) -> bool:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"edgetk_runner.py" in cmdline and f"bundles/{name}/".encode() in cmdline:
            return True
    return False


def test_sshd_killed_mid_check_fails_clearly_and_records_nothing(field: Field, deploy_bundle_factory) -> None:  # type: ignore[no-untyped-def]
    lab = field.lab
    bundle = deploy_bundle_factory(name="killed", seed=31)
    deploy_and_check(field, bundle)
    before = run_edgetk("history", "--bundle", "killed", "--json", env=field.env).json()

    proc = lab.popen_cli("check", bundle, "--inventory", field.inventory, *NO_GATES, "--runs", "5000000",
                         "--warmup", "0", "--json", env=field.env)
    try:
        _wait_for(lambda: _runner_running("killed"), timeout=60, what="the runner to start on the device")
        lab.device.kill_all()
        killed_at = time.monotonic()
        stdout, stderr = proc.communicate(timeout=90)
        to_fail = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"\nFIGURE sshd killed mid-check: failed {to_fail:.1f} s later")
    assert proc.returncode == 4, (stdout, stderr)
    doc = json.loads(stdout)
    (entry,) = doc["devices"]
    assert doc["passed"] is False and entry["ok"] is False and entry["reports"] == []
    assert "dropped" in entry["error"] or "connection" in entry["error"], entry["error"]
    assert to_fail < CUT_FAIL_LIMIT_S
    after = run_edgetk("history", "--bundle", "killed", "--json", env=field.env).json()
    assert after == before  # nothing recorded, least of all a passing check
