"""chacha20-poly1305@openssh.com (toolkit/devices/ssh_chacha.py) against the real servers: the Dropbear stand-in
(no AES-GCM) gets it, OpenSSH's sshd speaks it when it is the only offer, bytes arrive intact in both directions,
rekeying keeps working, and a packet changed on the way is refused."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import paramiko
import pytest

from tests.fixtures.dropbear import DropbearDevice
from toolkit.devices import open_connection, parse_spec, ssh_link
from toolkit.devices.spec import DeviceSpec
from toolkit.devices.ssh_chacha import CHACHA, TAG, ChachaKey

SHA256_OF_STDIN = "import sys, hashlib; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"


def _spec(device: Any, key: Path, known_hosts: Path) -> DeviceSpec:  # Any: an SshDevice or a DropbearDevice
    base = parse_spec(device.spec)
    return DeviceSpec(name="chacha", host=base.host, port=base.port, user=base.user, identity_file=str(key),
                      known_hosts=str(known_hosts))


def _round_trip(spec: DeviceSpec, python: str, *, rekey_every: int | None = None) -> int:
    """Send 3 MB to the device, read 1 MB back, over ChaCha20; the number of key exchanges seen."""
    data = os.urandom(3 << 20)
    with open_connection(spec) as conn:
        transport = conn.transport()  # type: ignore[attr-defined]
        assert (transport.local_cipher, transport.remote_cipher) == (CHACHA, CHACHA)
        packetizer = transport.packetizer
        keyed: list[str] = []
        outbound = packetizer.set_outbound_cipher

        def counting(*args: Any, **kwargs: Any) -> None:
            keyed.append(type(kwargs.get("block_engine", args[0] if args else None)).__name__)
            outbound(*args, **kwargs)

        packetizer.set_outbound_cipher = counting
        if rekey_every is not None:
            packetizer.REKEY_BYTES = rekey_every  # paramiko's 512 MiB, made small: this run rekeys on the way
        blocks = [data[at:at + (1 << 18)] for at in range(0, len(data), 1 << 18)]
        answer = conn.stream([python, "-c", SHA256_OF_STDIN], blocks, total=len(data),  # type: ignore[attr-defined]
                             timeout=120)
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip() == hashlib.sha256(data).hexdigest()
        back = conn.run([python, "-c", "import sys; sys.stdout.buffer.write(b'7' * (1 << 20))"], timeout=60)
        assert back.returncode == 0 and back.stdout == "7" * (1 << 20)
    assert all(name == "ChachaKey" for name in keyed)
    return len(keyed)


@pytest.mark.ssh
def test_openssh_speaks_chacha(ssh_devices: Any, ssh_client_key: Path, ssh_known_hosts: Any,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    dev = ssh_devices(1)[0]
    spec = _spec(dev, ssh_client_key, ssh_known_hosts(dev))
    with open_connection(spec) as conn:  # a server with AES-GCM gets it: the least CPU on this side
        assert conn.transport().local_cipher == "aes128-gcm@openssh.com"  # type: ignore[attr-defined]

    def chacha_only(transport: Any) -> None:
        transport.get_security_options().ciphers = (CHACHA,)

    monkeypatch.setattr(ssh_link, "_prefer_aead", chacha_only)
    assert _round_trip(spec, "python3") == 0


@pytest.mark.dropbear
def test_dropbear_speaks_chacha_and_rekeys(dropbear_device: DropbearDevice, dropbear_client_key: Path,
                                           dropbear_known_hosts: Any) -> None:
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device))
    assert _round_trip(spec, dropbear_device.python) == 0
    assert _round_trip(spec, dropbear_device.python, rekey_every=1 << 20) >= 1  # new ChaCha20 keys, same stream


def test_a_changed_packet_is_refused() -> None:
    secret = os.urandom(64)
    key = ChachaKey(secret)
    packet = b"\x00\x00\x00\x1c\x05" + b"payload of 18 b.." + b"\x00" * 5
    sealed = key.seal(7, packet)
    again = ChachaKey(secret)
    again.seal(3, packet + b"more")  # its key streams, reused per packet, start afresh for the next one
    assert again.seal(7, packet) == sealed
    assert len(sealed) == len(packet) + TAG and sealed[4:-TAG] != packet[4:]
    assert key.open_length(7, sealed[:4]) == 0x1c
    assert key.open(7, sealed[:4], sealed[4:]) == packet[4:]
    for at in (0, 4, len(sealed) - 1):  # the length, the body, the tag
        changed = bytearray(sealed)
        changed[at] ^= 1
        with pytest.raises(paramiko.SSHException, match="Mismatched MAC"):
            key.open(7, bytes(changed[:4]), bytes(changed[4:]))
    with pytest.raises(paramiko.SSHException, match="Mismatched MAC"):
        key.open(8, sealed[:4], sealed[4:])  # replayed as another packet
