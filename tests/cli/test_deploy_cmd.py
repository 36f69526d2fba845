"""``edgetk deploy/check/rollback/status/remove/history/devices probe`` end to end, as a user runs them:
a real subprocess, real sshd devices on loopback, the device-side venv (numpy + onnxruntime + ai-edge-litert,
no TensorFlow) running the runner. Tests that are not about the gates pass --budget-ms and --baseline none, so
timing noise cannot fail them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.fixtures.cli import assert_clean_error, run_edgetk, run_edgetk_inproc
from tests.fixtures.deploy_helpers import write_inventory
from tests.fixtures.home import Home, new_home

NO_GATES = ("--budget-ms", "100000", "--baseline", "none")


@pytest.fixture
def home(tmp_path):  # type: ignore[no-untyped-def]
    """A private HOME for the CLI subprocess: its ~/.edgetk is the `local` device, its known_hosts is empty."""
    path = new_home(tmp_path).path
    return path


def test_local_deploy_check_status_history(home, tiny_bundle, device_env, tmp_path):  # type: ignore[no-untyped-def]
    inventory = tmp_path / "inv.toml"
    inventory.write_text(f'[devices.here]\nhost = "local"\npython = "{device_env.python}"\n')
    env = Home(home).env
    result = run_edgetk("deploy", tiny_bundle, "--inventory", inventory, "--check", *NO_GATES, "--runs", "10",
                        "--json", env=env)
    assert result.code == 0, result.stderr
    doc = result.json()
    assert doc["passed"] is True
    (entry,) = doc["devices"]
    assert entry["device"] == "here" and entry["ok"] and entry["error"] is None
    manifest = json.loads((tiny_bundle / "manifest.json").read_text())
    assert sorted(r["artifact"] for r in entry["reports"]) == sorted(a["file"] for a in manifest["artifacts"])
    for report in entry["reports"]:
        assert report["error"] is None, report
        assert report["outputs_match"]["ok"] is True
        assert report["latency_ms"]["p50"] > 0 and report["runs"] == 10
        assert report["gates"]["passed"] is True
        assert report["environment"]["arch"] == "x86_64"
    assert "sent" in result.stderr  # upload progress goes to stderr, stdout is only JSON

    second = run_edgetk("check", tiny_bundle, "--inventory", inventory, "--device", "here", *NO_GATES,
                        "--runs", "10", env=env)
    assert second.code == 0, second.stderr
    assert "PASS" in second.stdout

    history = run_edgetk("history", "--device", "here", "--json", env=env)
    rows = history.json()
    assert len(rows) == 2 * len(manifest["artifacts"])
    assert {r["device"] for r in rows} == {"here"} and {r["bundle"] for r in rows} == {manifest["name"]}
    assert all(r["created_at"] for r in rows)
    text = run_edgetk("history", env=env)
    assert "2 checks (2 passed)" in text.stdout

    state = run_edgetk("status", "--device", "local", "--json", env=env).json()
    bundles = state["devices"][0]["bundles"]
    assert bundles[manifest["name"]]["current"] == json.loads(json.dumps(bundles))[manifest["name"]]["current"]


@pytest.mark.ssh
def test_ssh_deploy_check_rollback_remove(home, ssh_devices, ssh_client_key, ssh_known_hosts, device_env,  # type: ignore[no-untyped-def]
                                          deploy_bundle_factory, tmp_path):
    (dev,) = ssh_devices(1)
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=str(device_env.python), key=ssh_client_key,
                                known_hosts=ssh_known_hosts(dev), names=["pi-1"])
    env = Home(home).env
    v1 = deploy_bundle_factory(name="roll", seed=1)
    v2 = deploy_bundle_factory(name="roll", seed=2)
    for bundle in (v1, v2):
        result = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, "--json", env=env)
        assert result.code == 0, result.stderr
        report = result.json()["devices"][0]["reports"][0]
        assert report["device"] == "pi-1" and report["outputs_match"]["ok"]
        assert report["runtime"]["name"] == "onnxruntime"
    version1 = json.loads(result.stdout)["devices"][0]["deploy"]["previous"]
    back = run_edgetk("rollback", "roll", "--inventory", inventory, "--device", "pi-1", "--json", env=env)
    assert back.code == 0, back.stderr
    assert back.json()["devices"][0]["current"] == version1
    assert os.readlink(dev.home / ".edgetk/bundles/roll/current") == version1
    again = run_edgetk("check", v1, "--inventory", inventory, *NO_GATES, env=env)
    assert again.code == 0, again.stdout + again.stderr
    gone = run_edgetk("remove", "roll", "--inventory", inventory, env=env)
    assert gone.code == 0 and not (dev.home / ".edgetk/bundles/roll").exists()


@pytest.mark.ssh
def test_fleet_in_parallel_with_one_device_down(home, ssh_devices, fresh_ssh_device, ssh_client_key,  # type: ignore[no-untyped-def]
                                                ssh_known_hosts, device_env, deploy_bundle_factory, tmp_path):
    devices = ssh_devices(4)
    down = fresh_ssh_device()
    known = ssh_known_hosts(*devices, down)
    down.stop()
    inventory = write_inventory(tmp_path / "inv.toml", [*devices, down], python=str(device_env.python),
                                key=ssh_client_key, known_hosts=known)
    bundle = deploy_bundle_factory(name="fleet")
    result = run_edgetk("deploy", bundle, "--inventory", inventory, "--group", "lab", "--parallel", "5", "--check",
                        *NO_GATES, "--runs", "5", "--json", env=Home(home).env)
    assert result.code == 4, result.stderr
    doc = result.json()
    assert doc["passed"] is False
    by_name = {d["device"]: d for d in doc["devices"]}
    assert list(by_name) == [d.name for d in devices] + [down.name]
    for dev in devices:
        assert by_name[dev.name]["ok"], by_name[dev.name]
        assert by_name[dev.name]["reports"][0]["gates"]["passed"]
        assert (dev.home / ".edgetk/bundles/fleet/current/manifest.json").is_file()
    assert by_name[down.name]["ok"] is False
    assert "refused the connection" in by_name[down.name]["error"]
    assert by_name[down.name]["error"].startswith(f"{down.name}: ")
    assert f"error: {by_name[down.name]['error']}" in result.stderr  # --json: on stderr as well, named once
    assert f"{down.name}: {down.name}: " not in result.stderr
    text = run_edgetk("status", "--inventory", inventory, env=Home(home).env)
    assert text.code == 4 and "4 of 5 devices succeeded" in text.stderr


@pytest.mark.ssh
def test_host_keys_unknown_trusted_changed(home, fresh_ssh_device, ssh_client_key, device_env,  # type: ignore[no-untyped-def]
                                           deploy_bundle_factory):
    dev = fresh_ssh_device()
    bundle = deploy_bundle_factory(name="keys")
    known = home / "known_hosts"
    args = ("deploy", bundle, "--device", dev.spec, "--known-hosts", known)
    env = Home(home).env
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "config").write_text(f"Host 127.0.0.1\n  IdentityFile {ssh_client_key}\n")

    refused = run_edgetk(*args, env=env)
    assert_clean_error(refused, 4, "not in", "--trust-new-host")
    assert not known.exists()
    as_json = run_edgetk(*args, "--json", env=env)  # the document on stdout AND the plain error on stderr
    assert_clean_error(as_json, 4, "not in", "--trust-new-host")
    (entry,) = as_json.json()["devices"]
    assert not entry["ok"] and "--trust-new-host" in entry["error"]
    assert f"error: {entry['device']}: " in as_json.stderr
    assert not known.exists()
    trusted = run_edgetk(*args, "--trust-new-host", env=env)
    assert trusted.code == 0, trusted.stderr
    # recorded as ssh would (hashed where HashKnownHosts is on, as in Debian's /etc/ssh/ssh_config)
    assert known.read_text().split()[1:3] == dev.known_hosts_line().split()[1:3]
    assert run_edgetk(*args, env=env).code == 0  # now known

    dev.regenerate_host_key()
    changed = run_edgetk(*args, "--trust-new-host", env=env)
    assert changed.code == 4
    assert "CHANGED" in changed.stdout + changed.stderr and "ssh-keygen -R" in changed.stdout + changed.stderr


@pytest.mark.ssh
def test_device_without_runtime_gets_a_clear_report(home, ssh_devices, ssh_client_key, ssh_known_hosts, bare_env,  # type: ignore[no-untyped-def]
                                                    deploy_bundle_factory, tmp_path):
    (dev,) = ssh_devices(1)
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=str(bare_env.python), key=ssh_client_key,
                                known_hosts=ssh_known_hosts(dev), names=["bare"])
    result = run_edgetk("deploy", deploy_bundle_factory(name="tiny"), "--inventory", inventory, "--check",
                        *NO_GATES, "--json", env=Home(home).env)
    assert result.code == 1, result.stderr
    entry = result.json()["devices"][0]
    (report,) = entry["reports"]
    assert report["error"]["kind"] == "missing_runtime"
    assert "onnxruntime" in report["error"]["message"] + (report["error"]["hint"] or "")
    assert report["gates"]["passed"] is False and "missing_runtime" in entry["error"]


def test_gates_fail_on_budget_and_on_regression(home, device_env, deploy_bundle_factory, tmp_path):  # type: ignore[no-untyped-def]
    inventory = tmp_path / "inv.toml"
    inventory.write_text(f'[devices.here]\nhost = "local"\npython = "{device_env.python}"\n')
    from toolkit.model.policy import CheckPolicy, RegressionPolicy

    # no minimum effect in ms: the tiny model's microseconds can then regress against a doctored baseline
    policy = CheckPolicy(target=None, latency_budget_ms=None, regression=RegressionPolicy(min_slowdown_ms=0.0))
    bundle = deploy_bundle_factory(name="gated", check_policy=policy)
    env = Home(home).env
    ok = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, "--runs", "10", "--json",
                    env=env)
    assert ok.code == 0, ok.stderr
    baseline_id = ok.json()["devices"][0]["reports"][0]["check_id"]

    budget = run_edgetk("check", bundle, "--inventory", inventory, "--budget-ms", "0.000001", "--baseline", "none",
                        "--runs", "10", env=env)
    assert budget.code == 1
    assert "exceeds the budget of 1e-06 ms" in budget.stdout + budget.stderr

    # make the stored baseline's latency samples impossibly fast, then check against it by id
    import sqlite3

    db = sqlite3.connect(home / "history.sqlite")
    with db:
        (text,) = db.execute("SELECT report FROM checks WHERE check_id = ?", (baseline_id,)).fetchone()
        stored = json.loads(text)
        stored["latency_samples_ms"] = [1e-9] * len(stored["latency_samples_ms"])
        db.execute("UPDATE checks SET report = ? WHERE check_id = ?", (json.dumps(stored), baseline_id))
    db.close()
    regression = run_edgetk("check", bundle, "--inventory", inventory, "--budget-ms", "100000", "--baseline",
                            baseline_id, "--regression-pct", "10", "--runs", "10", "--json", env=env)
    assert regression.code == 1
    reasons = regression.json()["devices"][0]["reports"][0]["gates"]["reasons"]
    assert any("x baseline " + baseline_id in r for r in reasons), reasons
    unknown = run_edgetk("check", bundle, "--inventory", inventory, "--baseline", "nope", env=env)
    assert_clean_error(unknown, 2, "no stored check")


def test_arch_mismatch_exit_2_and_force(home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    bundle = deploy_bundle_factory(name="armonly", target_arch="aarch64")
    refused = run_edgetk("deploy", bundle, "--device", "local", env=Home(home).env)
    assert refused.code == 2
    assert "built for aarch64" in refused.stderr and "--force" in refused.stderr
    forced = run_edgetk("deploy", bundle, "--device", "local", "--force", env=Home(home).env)
    assert forced.code == 0, forced.stderr


def test_usage_errors(home, deploy_bundle_factory, tmp_path):  # type: ignore[no-untyped-def]
    bundle = deploy_bundle_factory(name="tiny")
    env = Home(home).env
    assert_clean_error(run_edgetk_inproc("deploy", bundle, env=env), 2, "no device given")
    assert_clean_error(run_edgetk_inproc("deploy", tmp_path, "--device", "local", env=env), 2, "not a bundle")
    bad = tmp_path / "bad.toml"
    bad.write_text('[devices.pi]\nhots = "1.2.3.4"\n')
    assert_clean_error(run_edgetk_inproc("status", "--inventory", bad, env=env), 2, "unknown key 'hots'",
                       "did you mean 'host'")
    assert_clean_error(run_edgetk_inproc("status", "--device", "a b;c", env=env), 2, "not a device spec")


def test_probe_local(home):  # type: ignore[no-untyped-def]
    result = run_edgetk("devices", "probe", "--device", "local", "--json", env=Home(home).env)
    assert result.code == 0, result.stderr
    probe = result.json()["devices"][0]["probe"]
    assert probe["environment"]["arch"] == "x86_64"
    assert probe["profile"] == "generic-x86_64"
