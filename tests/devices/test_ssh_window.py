"""Streams on exec channels in whole windows (toolkit/devices/ssh_window.py) against the real Dropbear stand-in
(24 KiB window, returned packet by packet): blocks that do not line up with packets still go as whole packets,
each ChaCha20 data packet is sealed once (ahead, while the window is waited for), and a device that reads slower
than the link (Dropbear then holds back part of its window) still gets every byte, intact."""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from pathlib import Path
from typing import Any

import paramiko
import pytest

from tests.fixtures.dropbear import DropbearDevice
from toolkit.devices import open_connection, parse_spec, ssh, ssh_link
from toolkit.devices.spec import DeviceSpec
from toolkit.devices.ssh_chacha import ChachaKey

# as the device helper receives a push: its stdin pipe widened to 1 MiB, so Dropbear writes each packet at once
SHA256_OF_STDIN = ("import sys, fcntl, hashlib; fcntl.fcntl(0, 1031, 1 << 20); "  # 1031: F_SETPIPE_SZ
                   "print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())")
# reads 1 KiB at a time from the raw pipe, with a pause each 64 KiB: the pipe fills, Dropbear writes packets
# into it in parts and holds back the window of the last part (under 8 KiB) until more data comes
SLOW_SHA256_OF_STDIN = (
    "import sys, os, time, hashlib\n"
    "h, n = hashlib.sha256(), 0\n"
    "while True:\n"
    "    b = os.read(0, 1024)\n"
    "    if not b: break\n"
    "    h.update(b); n += len(b)\n"
    "    if n % 65536 < 1024: time.sleep(0.002)\n"
    "print(h.hexdigest())\n"
)
MSG_CHANNEL_DATA = 94


def _spec(device: DropbearDevice, key: Path, known_hosts: Path) -> DeviceSpec:
    base = parse_spec(device.spec)
    return DeviceSpec(name="window", host=base.host, port=base.port, user=base.user, identity_file=str(key),
                      known_hosts=str(known_hosts))


def _send(spec: DeviceSpec, python: str, program: str, data: bytes, block: int,
          pumped: list[int] | None = None) -> list[int]:
    """Stream ``data`` in blocks of ``block`` bytes to ``program`` on the device, check its sha256 there; the
    sizes of the data packets that carried it (in ``pumped``, those the transport's own thread sent)."""
    sizes: list[int] = []
    caller = threading.get_ident()
    with open_connection(spec) as conn:
        packetizer = conn.transport().packetizer  # type: ignore[attr-defined]
        send_message = packetizer.send_message

        def recording(message: Any) -> None:  # Any: a paramiko Message
            payload = message.asbytes()
            if payload[0] == MSG_CHANNEL_DATA:
                sizes.append(struct.unpack(">I", payload[5:9])[0])
                if pumped is not None and threading.get_ident() != caller:
                    pumped.append(sizes[-1])
            send_message(message)

        packetizer.send_message = recording
        blocks = [data[at:at + block] for at in range(0, len(data), block)]
        answer = conn.stream([python, "-c", program], blocks,  # type: ignore[attr-defined]
                             total=len(data), timeout=120)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == hashlib.sha256(data).hexdigest()
    assert sum(sizes) == len(data)
    return sizes


@pytest.mark.timing  # how many packets go short depends on how fast the device drains its window
@pytest.mark.dropbear
def test_blocks_go_as_whole_packets_each_sealed_once(dropbear_device: DropbearDevice, dropbear_client_key: Path,
                                                     dropbear_known_hosts: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device))
    sealed: list[int] = []
    seal = ChachaKey.seal

    def counting(self: ChachaKey, seq: int, packet: bytes) -> bytes:
        if packet[5] == MSG_CHANNEL_DATA:
            sealed.append(seq)
        return seal(self, seq, packet)

    monkeypatch.setattr(ChachaKey, "seal", counting)
    data, pumped = os.urandom(3 << 20), list[int]()
    sizes = _send(spec, dropbear_device.python, SHA256_OF_STDIN, data, block=100_003,  # no block ends on a packet
                  pumped=pumped)
    assert sizes[0] == 24576  # Dropbear's whole window (a packet may be up to 32 KiB)
    short = [size for size in sizes[:-1] if size != sizes[0]]
    # a short packet only where the device fell 1 MiB behind (a loaded machine); sendall's were a third of them
    assert len(short) <= len(sizes) // 20, f"{len(short)} short packets of {len(sizes)}: {sorted(set(short))}"
    assert len(sealed) <= len(sizes) + 3, "data packets sealed again when sent instead of ahead"
    # most go from the transport's thread the moment it reads the window adjustment (the rest: a lost race)
    assert len(pumped) >= len(sizes) // 2, f"{len(pumped)} of {len(sizes)} packets sent on a window adjustment"


@pytest.mark.timing  # how many packets go short depends on how fast the device drains its window
@pytest.mark.dropbear
def test_paramikos_own_transport_streams_whole_packets_too(dropbear_device: DropbearDevice,
                                                           dropbear_client_key: Path, dropbear_known_hosts: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the toolkit's transport (AES-CTR + HMAC, no sealing ahead, no sending on window adjustments: the
    benchmark's row "without ChaCha20") the sending thread does it all."""
    monkeypatch.setattr(ssh_link, "ChachaTransport", paramiko.Transport)
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device))
    data, pumped = os.urandom(2 << 20), list[int]()
    sizes = _send(spec, dropbear_device.python, SHA256_OF_STDIN, data, block=100_003, pumped=pumped)
    assert not pumped
    short = [size for size in sizes[:-1] if size != sizes[0]]
    assert len(short) <= len(sizes) // 20, f"{len(short)} short packets of {len(sizes)}: {sorted(set(short))}"


@pytest.mark.dropbear
def test_a_device_that_reads_slowly_gets_every_byte(dropbear_device: DropbearDevice, dropbear_client_key: Path,
                                                    dropbear_known_hosts: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh, "UPLOAD_STALL_S", 10.0)  # a sender waiting for a window that never comes fails then
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device))
    data = os.urandom(2 << 20)
    sizes = _send(spec, dropbear_device.python, SLOW_SHA256_OF_STDIN, data, block=1 << 18)
    assert min(sizes[:-1]) < 24576  # Dropbear held part of its window back: a part went on its own
