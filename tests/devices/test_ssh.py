"""SshConnection against real OpenSSH servers on loopback: host keys, quoting, files, down devices."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from toolkit.devices import open_connection, parse_spec
from toolkit.devices.spec import DeviceSpec
from toolkit.errors import DeviceError

pytestmark = pytest.mark.ssh


def _spec(device, key: Path, known_hosts: Path | None = None) -> DeviceSpec:  # type: ignore[no-untyped-def]
    base = parse_spec(device.spec)
    return DeviceSpec(name=base.name, host=base.host, port=base.port, user=base.user, identity_file=str(key),
                      known_hosts=str(known_hosts) if known_hosts else None)


def test_run_put_get_exists(ssh_devices, ssh_client_key, ssh_known_hosts, tmp_path):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    known = ssh_known_hosts(dev)
    with open_connection(_spec(dev, ssh_client_key, known)) as conn:
        result = conn.run(["id", "-un"], timeout=10)
        assert result.ok and result.stdout.strip() == dev.user
        assert conn.run(["sh", "-c", "echo err >&2; exit 7"], timeout=10).returncode == 7
        src = tmp_path / "f.bin"
        src.write_bytes(b"x" * 300_000)
        seen = []
        conn.put(src, "f.bin", progress=lambda sent, total: seen.append((sent, total)))
        assert seen[-1] == (300_000, 300_000)
        assert (dev.home / "f.bin").read_bytes() == src.read_bytes()
        assert oct((dev.home / "f.bin").stat().st_mode & 0o777) == "0o644"
        assert conn.exists("f.bin") and not conn.exists("nope")
        conn.get("f.bin", tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()


def test_hostile_arguments_are_data_not_shell(ssh_devices, ssh_client_key, ssh_known_hosts):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    marker = dev.home / "PWNED"
    hostile = [f"a; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", "it's \"quoted\"", "sp ace", "|&<>*"]
    with open_connection(_spec(dev, ssh_client_key, ssh_known_hosts(dev))) as conn:
        result = conn.run(["printf", "%s\\n", *hostile], timeout=10)
    assert result.ok
    assert result.stdout.splitlines() == hostile
    assert not marker.exists()


def test_unknown_host_refused_then_trusted_and_recorded(ssh_devices, ssh_client_key, tmp_path):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    known = tmp_path / "known_hosts"
    with pytest.raises(DeviceError) as refused:
        with open_connection(_spec(dev, ssh_client_key, known)) as conn:
            conn.run(["true"])
    assert "not in" in refused.value.message and "--trust-new-host" in (refused.value.hint or "")
    assert refused.value.exit_code == 4
    assert not known.exists()
    with open_connection(_spec(dev, ssh_client_key, known), trust_new_host=True) as conn:
        assert conn.run(["true"]).ok
    # recorded as ssh records it (hashed when HashKnownHosts is on, as in Debian's /etc/ssh/ssh_config)
    assert known.read_text().split()[1:3] == dev.known_hosts_line().split()[1:3]
    found = subprocess.run(["ssh-keygen", "-F", f"[127.0.0.1]:{dev.port}", "-f", str(known)], capture_output=True,
                           text=True)
    assert found.returncode == 0 and dev.known_hosts_line().split()[2] in found.stdout
    with open_connection(_spec(dev, ssh_client_key, known)) as conn:  # now known: no flag needed
        assert conn.run(["true"]).ok


def test_changed_host_key_always_refused(fresh_ssh_device, ssh_client_key, ssh_known_hosts):  # type: ignore[no-untyped-def]
    dev = fresh_ssh_device()
    known = ssh_known_hosts(dev)
    dev.regenerate_host_key()
    for trust in (False, True):
        with pytest.raises(DeviceError) as refused:
            with open_connection(_spec(dev, ssh_client_key, known), trust_new_host=trust) as conn:
                conn.run(["true"])
        assert "CHANGED" in refused.value.message and "ssh-keygen -R" in (refused.value.hint or "")
    assert known.read_text() != dev.known_hosts_line()  # the old key is still what we trust


def test_down_device_fails_fast_with_device_error(fresh_ssh_device, ssh_client_key, ssh_known_hosts):  # type: ignore[no-untyped-def]
    dev = fresh_ssh_device()
    known = ssh_known_hosts(dev)
    dev.stop()
    # Hold the stopped device's port, bound but not listening: the kernel refuses connections to it, and no
    # other server started by the suite's other worker can take the port in between (it once did). The bind
    # waits for the stopped server's sockets to go (it once met them still there).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 20
        while True:
            try:
                holder.bind(("127.0.0.1", dev.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        started = time.perf_counter()
        with pytest.raises(DeviceError) as down, open_connection(_spec(dev, ssh_client_key, known)) as conn:
            conn.run(["true"])
    assert "refused the connection" in down.value.message
    assert time.perf_counter() - started < 60  # a bound that catches a hang (retries, a TCP timeout), not a speed


def test_command_timeout(ssh_devices, ssh_client_key, ssh_known_hosts):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    with open_connection(_spec(dev, ssh_client_key, ssh_known_hosts(dev))) as conn:
        started = time.perf_counter()
        with pytest.raises(DeviceError, match="did not finish within"):
            conn.run(["sleep", "120"], timeout=1)
        assert time.perf_counter() - started < 60  # far below 120 s: the timeout ended it, not the sleep


def test_ssh_config_alias(ssh_devices, ssh_client_key, ssh_known_hosts, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        f"Host pi-alias\n  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n  IdentityFile {ssh_client_key}\n"
    )
    (tmp_path / ".ssh" / "known_hosts").write_text(dev.known_hosts_line())
    monkeypatch.setenv("HOME", str(tmp_path))
    with open_connection(parse_spec("pi-alias")) as conn:
        assert conn.run(["id", "-un"]).stdout.strip() == dev.user
