"""Security, tested against real sshd devices: quoting, hostile and malicious bundles, secrets, permissions.

Host keys are tested where the SSH code is (not repeated here): unknown refused, --trust-new-host records,
changed key refused, through the API (tests/devices/test_ssh.py: test_unknown_host_refused_then_trusted_and_recorded,
test_changed_host_key_always_refused) and the CLI (tests/cli/test_deploy_cmd.py::test_host_keys_unknown_trusted_changed).
The device refusing to measure an artifact whose sha256 differs from the manifest: tests/runner/test_runner.py::
test_tampered_artifact_is_not_measured and, through deploy/check over SSH,
tests/faults/test_device_faults.py::test_corrupted_file_on_device_is_refused_by_check_and_repaired_by_deploy.
"""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.cli import assert_clean_error, run_edgetk, run_edgetk_inproc
from tests.fixtures.deploy import build_bundle
from tests.fixtures.deploy_helpers import write_inventory
from tests.fixtures.home import Home, new_home
from toolkit.delivery.bundle import sha256_file

REPO = Path(__file__).resolve().parents[2]
NO_GATES = ("--budget-ms", "100000", "--baseline", "none")
HOSTILE = "x; touch PWNED1 $(touch PWNED2) `touch PWNED3` 'q\" sp"
MARKERS = ("PWNED1", "PWNED2", "PWNED3")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = new_home(tmp_path).path
    return path


def test_no_code_path_auto_adds_host_keys() -> None:
    """No AutoAddPolicy / WarningPolicy anywhere in the package (only our refusing policy)."""
    offenders = []
    for path in (REPO / "toolkit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in ("AutoAddPolicy", "WarningPolicy"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


def _no_markers(*dirs: Path) -> None:
    for d in dirs:
        for marker in MARKERS:
            assert not list(d.rglob(marker)), (d, marker)


@pytest.mark.ssh
def test_hostile_bundle_name_and_python_path_are_data(home, ssh_devices, ssh_client_key, ssh_known_hosts,  # type: ignore[no-untyped-def]
                                                       device_env, tmp_path):
    """A bundle name and a device Python path full of shell syntax deploy, check and roll back as plain names."""
    (dev,) = ssh_devices(1)
    pydir = dev.workdir / HOSTILE
    pydir.mkdir(exist_ok=True)
    pydir.chmod(0o755)
    python = pydir / "python"  # a wrapper (a symlink would lose the venv)
    python.write_text(f'#!/bin/sh\nexec "{device_env.python}" "$@"\n')
    python.chmod(0o755)
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=str(python), key=ssh_client_key,
                                known_hosts=ssh_known_hosts(dev), names=["pi"])
    root = tmp_path / "bundles"
    root.mkdir()
    v1 = build_bundle(root / "v1", name=HOSTILE, seed=71)
    v2 = build_bundle(root / "v2", name=HOSTILE, seed=72)
    env = Home(home).env
    for bundle in (v1, v2):
        result = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, "--runs", "3",
                            "--json", env=env, cwd=tmp_path)
        assert result.code == 0, result.stdout
        assert result.json()["devices"][0]["reports"][0]["outputs_match"]["ok"]
    assert run_edgetk("rollback", HOSTILE, "--inventory", inventory, env=env, cwd=tmp_path).code == 0
    status = run_edgetk("status", "--inventory", inventory, "--json", env=env, cwd=tmp_path)
    assert HOSTILE in status.json()["devices"][0]["bundles"]
    assert run_edgetk("remove", HOSTILE, "--inventory", inventory, env=env, cwd=tmp_path).code == 0
    assert not (dev.home / ".edgetk" / "bundles" / HOSTILE).exists()
    _no_markers(dev.home, dev.workdir, tmp_path, REPO)


def _malicious(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A hand-crafted bundle that tries to reach outside; returns (bundle, the outside file it aims at)."""
    bundle = build_bundle(tmp_path / f"evil-{how}", name=f"evil-{how}", seed=81)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"host secret\n")
    manifest = json.loads((bundle / "manifest.json").read_text())
    if how == "dotdot-artifact":
        (tmp_path / "escape.onnx").write_bytes((bundle / "model.fp32.onnx").read_bytes())
        manifest["artifacts"][0]["file"] = "../escape.onnx"
    elif how == "absolute-golden":
        manifest["golden_inputs"] = str(outside)
    elif how == "dotdot-runner":
        manifest["runner"]["file"] = "../../../../../../tmp/edgetk-evil-runner.py"
    elif how == "symlink-artifact":
        (bundle / "model.fp32.onnx").unlink()
        (bundle / "model.fp32.onnx").symlink_to(outside)
        manifest["artifacts"][0]["sha256"] = sha256_file(outside)  # even with a matching hash
        manifest["artifacts"][0]["bytes"] = outside.stat().st_size
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle, outside


# in this process; the first also as a real process (what only a process shows: exit status, the whole stderr)
@pytest.mark.parametrize(("how", "in_process"), [
    *((how, True) for how in ("dotdot-artifact", "absolute-golden", "dotdot-runner", "symlink-artifact")),
    ("dotdot-artifact", False),
], ids=["dotdot-artifact", "absolute-golden", "dotdot-runner", "symlink-artifact", "dotdot-artifact-process"])
def test_malicious_bundle_is_refused_before_anything_is_written(home, tmp_path, how, in_process):  # type: ignore[no-untyped-def]
    bundle, _ = _malicious(tmp_path, how)
    before = sorted(p for p in home.rglob("*"))
    result = (run_edgetk_inproc if in_process else run_edgetk)("deploy", bundle, "--device", "local",
                                                               env=Home(home).env)
    needle = "not a regular file" if how == "symlink-artifact" else "escape the bundle"
    assert_clean_error(result, 2, needle)
    assert sorted(p for p in home.rglob("*")) == before  # the local device got nothing, not even ~/.edgetk
    assert not Path("/tmp/edgetk-evil-runner.py").exists()


@pytest.mark.ssh
def test_device_helper_refuses_paths_that_leave_the_bundle(ssh_devices, ssh_client_key, ssh_known_hosts):  # type: ignore[no-untyped-def]
    """Even a listing crafted past the host's checks cannot make the device write outside ~/.edgetk."""
    from toolkit.delivery.deployment import Device
    from toolkit.devices import DeviceSpec, open_connection, parse_spec
    from toolkit.errors import UsageError

    (dev,) = ssh_devices(1)
    base = parse_spec(dev.spec)
    spec = DeviceSpec(name=dev.name, host=base.host, port=base.port, user=base.user, identity_file=str(ssh_client_key))
    version = "ab" * 32
    listings = [
        [["../../../escaped.txt", "0" * 64, 1]],
        [["/tmp/escaped.txt", "0" * 64, 1]],
        [["golden/../../../escaped.txt", "0" * 64, 1]],
    ]
    with open_connection(spec, known_hosts=str(ssh_known_hosts(dev))) as conn:
        device = Device(spec, conn)
        for listing in listings:
            with pytest.raises(UsageError, match="leave the bundle"):
                device.helper("prepare", "evil", version, json.dumps(listing))
        for name, ver in (("..", version), ("../x", version), ("ok", "../../x"), ("ok", "/tmp")):
            with pytest.raises(UsageError, match="refusing"):
                device.helper("prepare", name, ver, "[]")
        # a symlinked directory planted inside a version cannot carry writes out of it
        vdir = dev.home / ".edgetk" / "bundles" / "evil" / version
        vdir.mkdir(parents=True, exist_ok=True)
        outside = dev.workdir / "outside"
        outside.mkdir(exist_ok=True)
        (vdir / "golden").symlink_to(outside)
        with pytest.raises(UsageError, match="link out of the bundle"):
            device.helper("prepare", "evil", version, json.dumps([["golden/inputs.npz", "0" * 64, 1]]))
    assert not list(outside.iterdir())
    assert not (dev.home / "escaped.txt").exists() and not Path("/tmp/escaped.txt").exists()
    subprocess.run(["rm", "-rf", str(dev.home / ".edgetk" / "bundles" / "evil")], check=True)


@pytest.mark.ssh
def test_key_passphrase_never_appears_anywhere(home, fresh_ssh_device, device_env, deploy_bundle_factory,  # type: ignore[no-untyped-def]
                                               tmp_path, monkeypatch):
    secret = "Tr0ub4dor-passphrase-9c1f"
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    dev = fresh_ssh_device()
    key = dev.workdir / "encrypted_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", secret, "-C", "enc", "-f", str(key)], check=True)
    dev.authorized_keys.write_text(dev.authorized_keys.read_text() + key.with_suffix(".pub").read_text())
    known = tmp_path / "known_hosts"
    known.write_text(dev.known_hosts_line())
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=str(device_env.python), key=key,
                                known_hosts=known, names=["locked-pi"])
    bundle = deploy_bundle_factory(name="secret")
    env = Home(home).env
    outputs = []

    ok = run_edgetk("--debug", "deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, "--runs", "3",
                    env={**env, "EDGETK_SSH_PASSPHRASE": secret})
    assert ok.code == 0, ok.stderr
    outputs.append(ok)
    wrong = run_edgetk("--debug", "deploy", bundle, "--inventory", inventory,
                       env={**env, "EDGETK_SSH_PASSPHRASE": secret[::-1]})
    assert wrong.code == 4 and "cannot decrypt the private key" in wrong.stderr, wrong.stderr
    outputs.append(wrong)
    missing = run_edgetk("deploy", bundle, "--inventory", inventory, env=env)
    assert_clean_error(missing, 4, "encrypted and no passphrase", "EDGETK_SSH_PASSPHRASE")
    outputs.append(missing)
    outputs.append(run_edgetk("--debug", "history", "--json", env=env))
    outputs.append(run_edgetk("--debug", "status", "--inventory", inventory, "--json",
                              env={**env, "EDGETK_SSH_PASSPHRASE": secret}))
    for result in outputs:
        assert secret not in result.stdout and secret not in result.stderr
        assert secret[::-1] not in result.stdout and secret[::-1] not in result.stderr
    for where in (home, dev.home, dev.workdir / "sshd.log"):
        files = [where] if where.is_file() else [p for p in where.rglob("*") if p.is_file() and not p.is_symlink()]
        for path in files:
            data = path.read_bytes()
            assert secret.encode() not in data and secret[::-1].encode() not in data, path
    assert (home / "history.sqlite").is_file()  # the store was written, and holds no secret


@pytest.mark.ssh
def test_installed_files_are_not_world_writable_even_with_a_careless_umask(home, fresh_ssh_device, ssh_client_key,  # type: ignore[no-untyped-def]
                                                                           ssh_known_hosts, device_env,
                                                                           deploy_bundle_factory, tmp_path):
    dev = fresh_ssh_device()
    original = dev._write_config

    def careless() -> Path:  # the device's SFTP server creates files with umask 000
        config = original()
        config.write_text(config.read_text().replace("internal-sftp", "internal-sftp -u 0000"))
        return config

    dev._write_config = careless  # type: ignore[method-assign]
    dev.stop()
    dev.start()
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=str(device_env.python), key=ssh_client_key,
                                known_hosts=ssh_known_hosts(dev), names=["perm"])
    for seed in (91, 92):
        result = run_edgetk("deploy", deploy_bundle_factory(name="perm", seed=seed), "--inventory", inventory,
                            "--check", *NO_GATES, "--runs", "3", env=Home(home).env)
        assert result.code == 0, result.stderr
    checked = 0
    for path in [dev.home / ".edgetk", *(dev.home / ".edgetk").rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        assert not mode & 0o002, (path, oct(mode))
        if stat.S_ISREG(mode) and "bundles" in path.parts:
            assert stat.S_IMODE(mode) in (0o644, 0o755), (path, oct(mode))
        checked += 1
    assert checked > 10
    assert os.readlink(dev.home / ".edgetk" / "bundles" / "perm" / "current")
