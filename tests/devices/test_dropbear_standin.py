"""The embedded stand-in (tests/fixtures/dropbear.py) is what it claims to be, seen from a plain SSH client:
Dropbear, a busybox-only userland with python3 + numpy, no SFTP, a small disk, a clock that can be shifted.
If one of these stopped holding, every test that relies on it would prove less than it says."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest

from tests.fixtures.dropbear import DropbearDevice

pytestmark = pytest.mark.dropbear


def _ssh(device: DropbearDevice, key: Path, known_hosts: Path, command: str, *, ipv6: bool = False) -> str:
    host = "::1" if ipv6 else "127.0.0.1"
    proc = subprocess.run(
        ["ssh", "-p", str(device.port), "-i", str(key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
         "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes", f"{device.user}@{host}",
         command],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_busybox_userland_python_and_small_home(dropbear_device: DropbearDevice, dropbear_client_key: Path,
                                                dropbear_known_hosts: Callable[..., Path]) -> None:
    known = dropbear_known_hosts(dropbear_device)
    out = _ssh(dropbear_device, dropbear_client_key, known,
               "command -v bash || echo no-bash; command -v sha256sum; sha256sum --help 2>&1 | head -1; echo $PATH; "
               "python3 -c 'import numpy, onnxruntime; print(\"numpy\", numpy.__version__)'; df -k . | tail -1")
    assert "no-bash" in out
    assert "GNU" not in out and "BusyBox" in out
    assert f"\n{dropbear_device.bin_dir}\n" in out  # PATH: the applets and python3, nothing else
    assert "numpy 2." in out
    with socket.create_connection(("127.0.0.1", dropbear_device.port), timeout=10) as sock:
        assert sock.recv(64).startswith(b"SSH-2.0-dropbear_2022.83")
    size_kb = int(out.strip().splitlines()[-1].split()[1])
    assert size_kb <= 64 * 1024
    assert _ssh(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device, ipv6=True), "echo six",
                ipv6=True).strip() == "six"


def test_sftp_subsystem_fails(dropbear_device: DropbearDevice, dropbear_client_key: Path) -> None:
    transport = paramiko.Transport(("127.0.0.1", dropbear_device.port))
    try:
        transport.connect(pkey=paramiko.Ed25519Key.from_private_key_file(str(dropbear_client_key)),
                          username=dropbear_device.user)
        with pytest.raises((paramiko.SSHException, EOFError)):
            paramiko.SFTPClient.from_transport(transport)
    finally:
        transport.close()


def test_clock_shift(fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path,
                     dropbear_known_hosts: Callable[..., Path]) -> None:
    device = fresh_dropbear_device(clock="+2d", home_mb=8)
    known = dropbear_known_hosts(device)
    # python3 (dynamic) sees the shifted clock; the static busybox applets cannot be preloaded and see the true one
    script = "python3 -c 'import time; print(int(time.time()))'"
    ahead = _ssh(device, dropbear_client_key, known, script).split()
    now = time.time()
    assert all(abs(int(v) - now - 2 * 86400) < 600 for v in ahead), ahead
    device.set_clock(None)
    assert abs(int(_ssh(device, dropbear_client_key, known, script).split()[0]) - time.time()) < 600
    filler = device.fill_home(1)
    assert device.free_mb() < 2
    filler.unlink()


def test_password_login_for_a_first_boot_board(fresh_dropbear_device: Callable[..., DropbearDevice]) -> None:
    device = fresh_dropbear_device(password="first-boot-pw", home_mb=8)
    transport = paramiko.Transport(("127.0.0.1", device.port))
    try:
        transport.connect(username=device.user, password="first-boot-pw")
        assert transport.is_authenticated()
    finally:
        transport.close()
    assert (device.home / ".ssh" / "authorized_keys").read_text() == ""  # no key yet
