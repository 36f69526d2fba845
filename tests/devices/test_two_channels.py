"""A streamed push's large file split across two channels of one connection (toolkit/delivery/deploy_stream.py,
``SideStream`` in toolkit/devices/ssh_window.py): its second half on a second exec channel, so two windows are
open at once through an SSH server's per-channel window. Against the real Dropbear stand-in (no SFTP), and an
OpenSSH device that allows one session per connection (``MaxSessions 1``: the second channel is refused, the
file goes whole on the first)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.devices.test_embedded_device import _push, _spec
from tests.devices.test_ssh_window import MSG_CHANNEL_DATA
from tests.fixtures.dropbear import DropbearDevice
from tests.fixtures.sshd import SshDevice
from toolkit.delivery import deploy_stream, deployment, push
from toolkit.delivery.bundle import read_bundle
from toolkit.devices import open_connection, ssh
from toolkit.devices.spec import DeviceSpec
from toolkit.devices.ssh_chacha import ChachaKey, ChachaPacketizer
from toolkit.errors import DeviceError
from toolkit.model.device_records import CommandResult


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[CommandResult | None]:
    """Records what each second channel answered (None: refused, or failed on the way)."""
    answers: list[CommandResult | None] = []
    real = ssh.SshConnection.side_stream

    def side_stream(self: ssh.SshConnection, argv: Any, blocks: Any) -> Any:
        wait = real(self, argv, blocks)
        if wait is None:
            answers.append(None)
            return None

        def recorded() -> CommandResult | None:
            answers.append(wait())
            return answers[-1]

        return recorded

    monkeypatch.setattr(ssh.SshConnection, "side_stream", side_stream)
    return answers


def _counting_data_packets(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """The sequence numbers of the data packets sealed, and of those sent."""
    sealed: list[int] = []
    sent: list[int] = []
    seal, send_message = ChachaKey.seal, ChachaPacketizer.send_message

    def counting_seal(self: ChachaKey, seq: int, packet: bytes) -> bytes:
        if packet[5] == MSG_CHANNEL_DATA:
            sealed.append(seq)
        return seal(self, seq, packet)

    def counting_send(self: ChachaPacketizer, message: Any) -> None:  # Any: a paramiko Message
        if message.asbytes()[0] == MSG_CHANNEL_DATA:
            sent.append(1)
        send_message(self, message)

    monkeypatch.setattr(ChachaKey, "seal", counting_seal)
    monkeypatch.setattr(ChachaPacketizer, "send_message", counting_send)
    return sealed, sent


@pytest.mark.dropbear
def test_a_large_file_goes_on_two_channels_and_arrives_whole(
        dropbear_device: DropbearDevice, dropbear_client_key: Path, dropbear_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device), name="twochan")
    bundle = read_bundle(deploy_bundle_factory(name="twochan", pad_mb=9, seed=41))
    big = max(bundle.files(), key=lambda f: f.bytes)
    assert big.bytes >= deploy_stream.SIDE_MIN
    answers = _recording(monkeypatch)
    sealed, sent = _counting_data_packets(monkeypatch)
    result = _push(spec, bundle)
    assert result.files_sent == len(bundle.files())
    # two senders would guess the same next sequence number: none seals ahead meanwhile, each packet sealed once
    assert len(sealed) <= len(sent) + 3, f"{len(sealed)} seals for {len(sent)} data packets"
    # one file large enough: its second half went on a second channel, whole, into the helper's side file
    assert len(answers) == 1 and answers[0] is not None, answers
    assert answers[0].returncode == 0 and answers[0].stdout.split() == [str(big.bytes // 2)], answers[0]
    vdir = dropbear_device.home / ".edgetk" / "bundles" / "twochan" / bundle.version
    for file in bundle.files():
        assert (vdir / file.path).read_bytes() == (bundle.path / file.path).read_bytes()
    assert not [p.name for p in vdir.iterdir() if p.name.startswith(".edgetk-side")]


@pytest.mark.dropbear
def test_a_second_channel_that_fails_on_the_way_sends_the_rest_on_the_first(
        dropbear_device: DropbearDevice, dropbear_client_key: Path, dropbear_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second channel's receiver dies after 1 MiB (killed on the device, out of memory): the file's second
    half then follows on the first channel, and the push installs it whole."""
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device), name="sidefail")
    bundle = read_bundle(deploy_bundle_factory(name="sidefail", pad_mb=9, seed=43))
    answers = _recording(monkeypatch)
    monkeypatch.setattr(deploy_stream, "SIDE_PROGRAM", "import os, sys\nopen(sys.argv[1], 'wb').write("
                        "sys.stdin.buffer.read(1 << 20))\nos._exit(9)\n")
    _push(spec, bundle)
    assert len(answers) == 1 and (answers[0] is None or answers[0].returncode != 0), answers
    current = dropbear_device.home / ".edgetk" / "bundles" / "sidefail" / "current"
    for file in bundle.files():
        assert (current / file.path).read_bytes() == (bundle.path / file.path).read_bytes()


def test_a_device_that_refuses_a_second_channel_gets_the_file_on_one(
        fresh_ssh_device: Callable[[], SshDevice], ssh_client_key: Path, ssh_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    device = fresh_ssh_device()
    device.stop()
    config = device._write_config()
    original = device._write_config
    device._write_config = lambda: (config.write_text(  # type: ignore[method-assign]
        original().read_text().replace("MaxSessions 100", "MaxSessions 1")), config)[1]
    device.start()
    spec = DeviceSpec(name="onesession", host="127.0.0.1", port=device.port, user=device.user,
                      identity_file=str(ssh_client_key), known_hosts=str(ssh_known_hosts(device)))
    bundle = read_bundle(deploy_bundle_factory(name="onesession", pad_mb=9, seed=42))
    answers = _recording(monkeypatch)
    conn = open_connection(spec)
    conn._sftp_broken = "turned off: the stream Dropbear devices get"  # type: ignore[attr-defined]
    try:
        result = push.push(deployment.Device(spec, conn), bundle, progress_stream=io.StringIO())
    finally:
        conn.close()
    assert result.files_sent == len(bundle.files())
    assert answers == [None]  # refused: nothing started, the file went whole on the one channel
    current = Path(device.home) / ".edgetk" / "bundles" / "onesession" / "current"
    for file in bundle.files():
        assert (current / file.path).read_bytes() == (bundle.path / file.path).read_bytes()


@pytest.mark.dropbear
def test_a_push_cut_while_on_two_channels_resumes(
        dropbear_device: DropbearDevice, dropbear_client_key: Path, dropbear_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection cut (its socket closed under it) once 4 MB went out on the two channels: the next push
    resumes the file from what its first part left, sends the rest on two channels again, installs it whole
    and leaves no second-channel part behind."""
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device), name="twocut")
    bundle = read_bundle(deploy_bundle_factory(name="twocut", pad_mb=12, seed=44))
    big = max(bundle.files(), key=lambda f: f.bytes)
    conn = open_connection(spec)
    real_count = deploy_stream.Tally.count

    def cutting(self: deploy_stream.Tally, blocks: Any) -> Any:
        for block in real_count(self, blocks):
            if self.sent > 4_000_000:
                conn._transport().sock.close()  # type: ignore[attr-defined]  # the link goes, mid-push
            yield block

    monkeypatch.setattr(deploy_stream.Tally, "count", cutting)
    try:
        with pytest.raises(DeviceError):
            push.push(deployment.Device(spec, conn), bundle, progress_stream=io.StringIO())
    finally:
        conn.close()
    monkeypatch.setattr(deploy_stream.Tally, "count", real_count)
    vdir = dropbear_device.home / ".edgetk" / "bundles" / "twocut" / bundle.version
    assert (vdir / big.path).stat().st_size > 0  # what came on the first channel (the helper may still write)
    answers = _recording(monkeypatch)
    result = _push(spec, bundle)
    assert 0 < result.bytes_resumed < big.bytes // 2  # the first channel's part, cut short, is kept
    assert len(answers) == 1 and answers[0] is not None and answers[0].returncode == 0, answers
    for file in bundle.files():
        assert (vdir / file.path).read_bytes() == (bundle.path / file.path).read_bytes()
    assert not [p.name for p in vdir.iterdir() if p.name.startswith(".edgetk-side")]
