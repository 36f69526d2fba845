"""``chacha20-poly1305@openssh.com`` for paramiko (which has no ChaCha20 cipher): OpenSSH's first choice, and the
fastest cipher of devices without AES instructions. Dropbear as shipped (OpenWrt, Buildroot, Yocto) offers only
it and AES-CTR with an HMAC, which it computes in software: on the Dropbear stand-in a 50 MB push cost the
device 0.92-0.96 s of CPU with AES-CTR + HMAC-SHA2-256, 0.55-0.77 s with ChaCha20 (docs/benchmarks.md, "Push
speed").

The construction (OpenSSH's PROTOCOL.chacha20poly1305): 64 bytes of key, the first 32 the main key K_2, the
last 32 the length key K_1. Per packet with sequence number ``seq`` (the 64-bit DJB ChaCha20: an 8-byte
little-endian block counter, then ``seq`` as 8 big-endian bytes): the 4-byte length encrypted with K_1 at
block 0; with K_2, block 0 gives the Poly1305 key and blocks 1... encrypt the rest of the packet; the 16-byte
tag covers the encrypted length and the encrypted rest, and is checked before anything is decrypted.

:class:`ChachaTransport` offers it too and otherwise negotiates exactly as paramiko does (``ssh_link`` orders);
:class:`ChachaPacketizer` frames its packets and leaves every other cipher to paramiko. The packetizer's state
(sequence numbers, byte counts for rekeying) is paramiko's own (its name-mangled attributes; paramiko is
pinned in pyproject.toml, and the suite talks ChaCha20 to real OpenSSH and Dropbear servers).
"""

from __future__ import annotations

import os
import struct
from typing import Any

import paramiko
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms
from cryptography.hazmat.primitives.poly1305 import Poly1305
from paramiko.common import xffffffff
from paramiko.message import Message
from paramiko.packet import Packetizer

from toolkit.compat import paramiko as paramiko_compat
from toolkit.devices.ssh_signal import CHANNEL_HANDLERS
from toolkit.devices.ssh_watch import ByteStream

CHACHA = "chacha20-poly1305@openssh.com"
TAG = 16
BLOCK = 8  # the cipher's "block size": the packet (length field excluded) is padded to a multiple of it
PACKET_MAX = 1 << 18  # a longer length field is refused before reading it (OpenSSH: 256 KiB)


class ChachaKey:
    """The two keys of one direction (paramiko hands an AEAD cipher class its key and uses the object as the
    engine; this one only holds the keys: :class:`ChachaPacketizer` does the work)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 64:
            raise ValueError("chacha20-poly1305 needs 64 bytes of key")
        self.main, self.length = key[:32], key[32:]
        self._contexts: dict[bytes, CipherContext] = {}

    def stream(self, key: bytes, seq: int) -> CipherContext:
        """The ChaCha20 key stream of packet ``seq`` from block 0 (encrypting and decrypting are the same XOR):
        one context per key whose nonce is reset per packet (cryptography >= 43; a new context costs about 8x
        more, and there is one per key per packet each way), else a new context."""
        nonce = b"\0" * 8 + struct.pack(">Q", seq)
        context = self._contexts.get(key)
        if context is not None and hasattr(context, "reset_nonce"):
            context.reset_nonce(nonce)
            return context
        context = self._contexts[key] = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
        return context

    def seal(self, seq: int, packet: bytes) -> bytes:
        """The wire form of a plain ``packet`` (its 4-byte length first): encrypted length, rest, tag."""
        length = self.stream(self.length, seq).update(packet[:4])
        main = self.stream(self.main, seq)
        poly_key = main.update(b"\0" * 64)[:32]  # block 0; the rest of the packet from block 1
        body = length + main.update(packet[4:])
        return body + Poly1305.generate_tag(poly_key, body)

    def open_length(self, seq: int, sealed: bytes) -> int:
        """The packet length from its 4 encrypted bytes (not yet authenticated: only bounded, then checked with
        the tag)."""
        return int(struct.unpack(">I", self.stream(self.length, seq).update(sealed))[0])

    def open(self, seq: int, sealed_length: bytes, rest: bytes) -> bytes:
        """The plain packet after its length (padding length, payload, padding), once the tag checks out."""
        main = self.stream(self.main, seq)
        poly_key = main.update(b"\0" * 64)[:32]
        try:
            Poly1305.verify_tag(poly_key, sealed_length + rest[:-TAG], rest[-TAG:])
        except InvalidSignature:
            raise paramiko.SSHException("Mismatched MAC") from None
        return main.update(rest[:-TAG])


class ChachaPacketizer(Packetizer):  # type: ignore[misc, unused-ignore]  # paramiko: untyped
    """paramiko's packetizer, framing packets itself while the cipher is ChaCha20-Poly1305."""

    def _get(self, name: str) -> Any:  # Any: the field's own type
        return paramiko_compat.packetizer_field(self, name)

    def _set(self, name: str, value: object) -> None:
        paramiko_compat.set_packetizer_field(self, name, value)

    _ahead: tuple[bytes, ChachaKey, int, bytes] | None = None  # payload, key, sequence number, sealed packet

    @staticmethod
    def _framed(payload: bytes) -> bytes:
        padding = 3 + BLOCK - ((len(payload) + 4) % BLOCK)  # at least 4 bytes, packet_length % 8 == 0
        return struct.pack(">IB", len(payload) + padding + 1, padding) + payload + os.urandom(padding)

    def seal_ahead(self, payload: bytes) -> None:
        """Seal ``payload`` now as the next packet, while the sender would wait anyway (for the server's window:
        ``ssh_window``): ``send_message`` sends it as sealed when it is the next to go, with the same keys and
        sequence number, and seals afresh otherwise (another packet went first, a rekey); a packet sealed ahead
        and not sent never leaves this process, so no key stream is seen twice. Nothing happens under another
        cipher."""
        with self._get("write_lock"):
            engine = self._get("block_engine_out")
            if isinstance(engine, ChachaKey) and self._get("compress_engine_out") is None:
                seq = self._get("sequence_number_out")
                self._ahead = (payload, engine, seq, engine.seal(seq, self._framed(payload)))

    def send_message(self, data: Message) -> None:
        engine = self._get("block_engine_out")
        if not isinstance(engine, ChachaKey):
            return super().send_message(data)  # type: ignore[no-any-return, unused-ignore]
        payload = data.asbytes()
        if self._get("compress_engine_out") is not None:
            raise paramiko.SSHException("compression is not used with chacha20-poly1305 here")
        with self._get("write_lock"):
            seq = self._get("sequence_number_out")
            ahead, self._ahead = self._ahead, None
            if ahead is not None and ahead[1] is engine and ahead[2] == seq and ahead[0] == payload:
                out = ahead[3]
            else:
                out = engine.seal(seq, self._framed(payload))
            next_seq = (seq + 1) & xffffffff
            if next_seq == 0 and not self._initial_kex_done:
                raise paramiko.SSHException("Sequence number rolled over during initial kex!")
            self._set("sequence_number_out", next_seq)
            self.write_all(out)
            self._set("sent_bytes", self._get("sent_bytes") + len(out))
            self._set("sent_packets", self._get("sent_packets") + 1)
            if (self._get("sent_packets") >= self.REKEY_PACKETS or self._get("sent_bytes") >= self.REKEY_BYTES) \
                    and not self._get("need_rekey"):
                self._set("received_bytes_overflow", 0)
                self._set("received_packets_overflow", 0)
                self._trigger_rekey()
        return None

    def read_message(self) -> tuple[int, Message]:
        engine = self._get("block_engine_in")
        if not isinstance(engine, ChachaKey):
            return super().read_message()  # type: ignore[no-any-return, unused-ignore]
        if self._get("compress_engine_in") is not None:
            raise paramiko.SSHException("compression is not used with chacha20-poly1305 here")
        seq = self._get("sequence_number_in")
        sealed_length = self.read_all(4, check_rekey=True)
        size = engine.open_length(seq, sealed_length)
        if size % BLOCK or not 5 <= size <= PACKET_MAX:
            raise paramiko.SSHException("Invalid packet blocking")
        packet = engine.open(seq, sealed_length, self.read_all(size + TAG))
        padding = packet[0]
        payload = packet[1:size - padding]
        if not payload:
            raise paramiko.SSHException("Invalid packet padding")
        message = Message(payload[1:])
        message.seqno = seq
        next_seq = (seq + 1) & xffffffff
        if next_seq == 0 and not self._initial_kex_done:
            raise paramiko.SSHException("Sequence number rolled over during initial kex!")
        self._set("sequence_number_in", next_seq)
        self._count_received(size + TAG + 4)
        return payload[0], message

    def _count_received(self, raw: int) -> None:
        """paramiko's rekey bookkeeping for one packet read (``read_message``'s tail)."""
        self._set("received_bytes", self._get("received_bytes") + raw)
        self._set("received_packets", self._get("received_packets") + 1)
        if self._get("need_rekey"):
            self._set("received_bytes_overflow", self._get("received_bytes_overflow") + raw)
            self._set("received_packets_overflow", self._get("received_packets_overflow") + 1)
            if (self._get("received_packets_overflow") >= self.REKEY_PACKETS_OVERFLOW_MAX
                    or self._get("received_bytes_overflow") >= self.REKEY_BYTES_OVERFLOW_MAX):
                raise paramiko.SSHException("Remote transport is ignoring rekey requests")
        elif self._get("received_packets") >= self.REKEY_PACKETS or self._get("received_bytes") >= self.REKEY_BYTES:
            self._set("received_bytes_overflow", 0)
            self._set("received_packets_overflow", 0)
            self._trigger_rekey()


class ChachaTransport(paramiko.Transport):  # type: ignore[misc, unused-ignore]  # paramiko: untyped
    """A paramiko transport that also speaks ``chacha20-poly1305@openssh.com``."""

    _preferred_ciphers = (CHACHA, *paramiko_compat.preferred_ciphers())
    _cipher_info = {
        **paramiko_compat.cipher_info(),
        # block size 8 and a 12-byte "IV" nobody uses: what paramiko's key set-up and padding expect of an AEAD
        CHACHA: {"class": ChachaKey, "block-size": BLOCK, "iv-size": 12, "key-size": 64, "is_aead": True},
    }

    # a window adjustment sends an exec stream's next packet at once; a command's exit-signal is read (ssh_signal)
    _channel_handler_table = CHANNEL_HANDLERS

    def __init__(self, sock: ByteStream, **kwargs: object) -> None:
        super().__init__(sock, packetizer_class=ChachaPacketizer, **kwargs)
