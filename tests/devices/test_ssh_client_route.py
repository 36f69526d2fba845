"""A large push's stream through the system ``ssh`` client (toolkit/devices/ssh_client.py), against the real
Dropbear stand-in (no SFTP, busybox) and a real OpenSSH server: the files land whole and hash-checked, the client
takes only the host key edgetk verified, a host without ``ssh`` falls back to paramiko, a cut resumes."""

from __future__ import annotations

import io
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.deploy_helpers import cutting_stream, push_recording_commands
from tests.fixtures.dropbear import DropbearDevice
from tests.fixtures.sshd import SshDevice
from toolkit.delivery import deploy_stream, deployment, push
from toolkit.delivery.bundle import Bundle, read_bundle
from toolkit.devices import open_connection, ssh_client
from toolkit.devices.spec import DeviceSpec
from toolkit.devices.ssh import SshConnection
from toolkit.errors import DeviceError, HostKeyRefused, LinkDropped

pytestmark = pytest.mark.dropbear

BIG_MB = ssh_client.SSH_CLIENT_MIN_BYTES / 1e6 + 1  # just over the threshold: the client's route
HOME_MB = 256  # room for two versions of such a bundle (the shared stand-in's small disk is for other tests)


def _spec(device: DropbearDevice | SshDevice, key: Path, known_hosts: Path, name: str) -> DeviceSpec:
    return DeviceSpec(name=name, host="127.0.0.1", port=device.port, user=device.user, identity_file=str(key),
                      known_hosts=str(known_hosts))


def _push(spec: DeviceSpec, bundle: Bundle) -> push.PushResult:
    conn = open_connection(spec)
    try:
        return push.push(deployment.Device(spec, conn), bundle, progress_stream=io.StringIO())
    finally:
        conn.close()


def _installed(home: Path, bundle: Bundle) -> None:
    current = home / ".edgetk" / "bundles" / bundle.name / "current"
    assert os.readlink(current) == bundle.version
    for file in bundle.files():
        assert (current / file.path).read_bytes() == (bundle.path / file.path).read_bytes(), file.path


def _ssh_children() -> list[int]:
    """The ``ssh`` processes this test process started (the client route's)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if name == "ssh" and int(rest[1]) == os.getpid():
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("kind", ["dropbear", "openssh"])
def test_a_large_push_goes_through_the_ssh_client_whole_and_hash_checked(
        kind: str, fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path,
        dropbear_known_hosts: Callable[..., Path], ssh_devices: Callable[[int], list[SshDevice]],
        ssh_client_key: Path, ssh_known_hosts: Callable[..., Path], deploy_bundle_factory: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the threshold, the stream goes through ``ssh`` (paramiko opens no channel for it), lands
    byte-identical and is installed; a byte flipped on the way is refused by the device's hash check."""
    if kind == "dropbear":
        device: DropbearDevice | SshDevice = fresh_dropbear_device(home_mb=HOME_MB)
        spec = _spec(device, dropbear_client_key, dropbear_known_hosts(device), "route-db")
    else:
        (device,) = ssh_devices(1)
        spec = _spec(device, ssh_client_key, ssh_known_hosts(device), "route-os")
    bundle = read_bundle(deploy_bundle_factory(name=f"route-{kind}", pad_mb=BIG_MB, seed=51))
    result, channels = push_recording_commands(spec, bundle)
    assert result.route.startswith("ssh client"), result.route
    assert result.files_sent == len(bundle.files()) and result.bytes_sent == result.bytes_total
    assert not [c for c in channels if " push " in c], channels  # the stream did not go over paramiko
    _installed(device.home, bundle)

    bad = read_bundle(deploy_bundle_factory(name=f"route-{kind}", pad_mb=BIG_MB, seed=52))
    real_frames = deploy_stream.frames

    def flip_one_byte(files: Any) -> Any:
        for block in real_frames(files):
            yield block[:-1] + bytes([block[-1] ^ 1]) if len(block) > 1000 else block

    monkeypatch.setattr(deploy_stream, "frames", flip_one_byte)
    with pytest.raises(DeviceError, match="sha256|hash"):
        _push(spec, bad)
    _installed(device.home, bundle)  # the running version untouched


def test_the_ssh_client_never_accepts_an_unknown_host(
        ssh_devices: Callable[[int], list[SshDevice]], ssh_client_key: Path, ssh_known_hosts: Callable[..., Path],
        tmp_path: Path) -> None:
    """The client's options with an empty pinned known_hosts: the host is refused without a prompt, and nothing
    is recorded (as ``StrictHostKeyChecking yes`` and ``BatchMode yes`` mean)."""
    (device,) = ssh_devices(1)
    conn = open_connection(_spec(device, ssh_client_key, ssh_known_hosts(device), "unknown-host"))
    try:
        empty = tmp_path / "empty_known_hosts"
        empty.write_text("")
        unknown = subprocess.run(["ssh", *ssh_client.ssh_options(conn, empty, "ssh-ed25519"), "true"],  # type: ignore[arg-type]
                                 capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        conn.close()
    assert unknown.returncode == 255 and ssh_client.HOST_KEY_FAILED in unknown.stderr, unknown
    assert empty.read_text() == ""  # nothing recorded


def test_the_ssh_client_refuses_a_host_key_other_than_the_one_verified(
        fresh_ssh_device: Callable[..., SshDevice], ssh_client_key: Path, ssh_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any) -> None:
    """The device re-keyed between paramiko's check and the client's connection (as an interceptor would look):
    the push is refused as a host key problem, not retried over paramiko, and nothing is installed."""
    device = fresh_ssh_device()
    spec = _spec(device, ssh_client_key, ssh_known_hosts(device), "rekeyed")
    bundle = read_bundle(deploy_bundle_factory(name="rekeyed", pad_mb=BIG_MB, seed=53))
    conn = open_connection(spec)
    try:
        conn.run(["true"])  # paramiko connected and checked the key it knows
        device.regenerate_host_key()  # the sshd that answers next has another key
        with pytest.raises(HostKeyRefused, match="ssh client refused"):
            push.push(deployment.Device(spec, conn), bundle, progress_stream=io.StringIO())
    finally:
        conn.close()
    assert not (device.home / ".edgetk" / "bundles" / "rekeyed" / "current").exists()


def test_without_an_ssh_client_the_push_stays_on_paramiko(
        fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path, dropbear_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``ssh`` on PATH: the same large push goes over paramiko's exec stream, says so, and lands whole."""
    dropbear_device = fresh_dropbear_device(home_mb=HOME_MB)
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device), "no-client")
    bundle = read_bundle(deploy_bundle_factory(name="no-client", pad_mb=BIG_MB, seed=54))
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    result = _push(spec, bundle)
    assert result.route == "paramiko exec stream (no ssh client on PATH)", result.route
    _installed(dropbear_device.home, bundle)


def test_a_cut_of_the_ssh_client_mid_stream_is_a_dropped_link_and_the_next_push_resumes(
        fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path, dropbear_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client killed once 3 MB went out: a dropped link, nothing installed; the next push (the client's route
    again) resumes the file from what arrived and installs every file whole."""
    dropbear_device = fresh_dropbear_device(home_mb=HOME_MB)
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device), "client-cut")
    bundle = read_bundle(deploy_bundle_factory(name="client-cut", pad_mb=BIG_MB, seed=55))
    big = max(bundle.files(), key=lambda f: f.bytes)
    real_counted = deploy_stream.counted

    def kill_the_client() -> None:  # the client goes, mid-push
        for pid in _ssh_children():
            os.kill(pid, signal.SIGKILL)

    monkeypatch.setattr(deploy_stream, "counted", cutting_stream(kill_the_client))
    with pytest.raises(LinkDropped):
        _push(spec, bundle)
    assert not (dropbear_device.home / ".edgetk" / "bundles" / "client-cut" / "current").exists()
    monkeypatch.setattr(deploy_stream, "counted", real_counted)
    result = _push(spec, bundle)
    assert result.route.startswith("ssh client"), result.route
    assert 0 < result.bytes_resumed < big.bytes
    _installed(dropbear_device.home, bundle)


def test_a_client_that_cannot_log_in_falls_back_to_paramiko(
        fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path,
        dropbear_known_hosts: Callable[..., Path], deploy_bundle_factory: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The client given a key the device does not know (a fault planted in its options: a real ssh really
    refused) ends before the command starts: the push goes over paramiko, lands whole and says why."""
    device = fresh_dropbear_device(home_mb=HOME_MB)
    spec = _spec(device, dropbear_client_key, dropbear_known_hosts(device), "no-login")
    bundle = read_bundle(deploy_bundle_factory(name="no-login", pad_mb=BIG_MB, seed=56))
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    real_options = ssh_client.ssh_options

    def wrong_key(*args: Any) -> list[str]:
        options = real_options(*args)
        at = options.index("-i")
        return [*options[:at + 1], str(stranger), *options[at + 2:], ]

    monkeypatch.setattr(ssh_client, "ssh_options", wrong_key)
    result = _push(spec, bundle)
    assert result.route.startswith("paramiko exec stream (the ssh client did not get in"), result.route
    _installed(device.home, bundle)


def test_a_device_behind_a_jump_host_or_a_passphrase_stays_on_paramiko(
        dropbear_client_key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the client cannot be given as paramiko has it (a ProxyJump, a passphrase held by edgetk) keeps the
    push on paramiko, saying why; nothing connects here (the route is decided before)."""
    big = ssh_client.SSH_CLIENT_MIN_BYTES
    jumped = open_connection(DeviceSpec(name="jumped", host="10.0.0.2", user="root", port=22,
                                        identity_file=str(dropbear_client_key), proxy_jump="root@10.0.0.1"))
    assert isinstance(jumped, SshConnection)
    assert ssh_client.client_streams(jumped, total=big) == (
        None, "the device is reached through a ProxyJump or ProxyCommand")
    monkeypatch.setenv("EDGETK_SSH_PASSPHRASE", "secret")
    locked = open_connection(DeviceSpec(name="locked", host="10.0.0.2", user="root", port=22,
                                        identity_file=str(dropbear_client_key)))
    assert isinstance(locked, SshConnection)
    route, why = ssh_client.client_streams(locked, total=big)
    assert route is None and why is not None and "passphrase" in why
    assert ssh_client.client_streams(locked, total=big - 1) == (None, None)  # too small
