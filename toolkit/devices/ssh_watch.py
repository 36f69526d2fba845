"""How an SSH connection notices a dead link or a frozen device (``ssh_link``'s "Reliability").

``WatchedSocket`` wraps the transport's byte stream and keeps the time of the last byte received;
``Watchdog`` sends keepalives after silence and cuts the connection after ``ServerAliveCountMax`` silent
intervals, telling a frozen device (its kernel still acknowledges TCP) from a dead link (nothing acknowledged).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any, Protocol

import paramiko


class Watched(Protocol):
    """What the watchdog needs of the link it watches (``toolkit.devices.ssh_link.SshLink``): its name, and
    where it reports a cut from its own thread."""

    name: str

    def watchdog_cut(self, what: str, *, link_gone: bool) -> None:
        """``what`` was silent: the link itself is gone (``link_gone``: no TCP acknowledgements either) or the
        device stopped answering (TCP still acknowledged)."""


class ByteStream(Protocol):
    """A transport's byte stream as paramiko uses it: a socket, a ProxyJump channel or a ProxyCommand."""

    def recv(self, size: int, /) -> bytes: ...

    def send(self, data: bytes, /) -> int: ...

    def settimeout(self, value: float | None, /) -> None: ...

    def close(self) -> None: ...


class WatchedSocket:
    """The transport's byte stream (a socket, a ProxyJump channel or a ProxyCommand) with the time of the last
    byte received: the watchdog's clock."""

    def __init__(self, inner: ByteStream) -> None:
        self.inner = inner
        self.last_recv = time.monotonic()

    def recv(self, n: int) -> bytes:
        data: bytes = self.inner.recv(n)
        if data:
            self.last_recv = time.monotonic()
        return data

    def send(self, data: bytes) -> int:
        return int(self.inner.send(data))

    def settimeout(self, value: float | None) -> None:
        self.inner.settimeout(value)

    def close(self) -> None:
        self.inner.close()

    def peer_acks_within(self, seconds: float) -> bool | None:
        """Whether the peer's kernel acknowledged TCP data within ``seconds`` (None: cannot tell, not a TCP
        socket of ours). A frozen device's kernel still ACKs (zero-window probes, keepalives); a dead link not."""
        if not isinstance(self.inner, socket.socket) or not hasattr(socket, "TCP_INFO"):
            return None
        try:
            info = self.inner.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        except OSError:
            return None
        if len(info) < 60:
            return None
        last_ack_recv_ms = struct.unpack_from("I", info, 56)[0]  # struct tcp_info.tcpi_last_ack_recv
        return bool(last_ack_recv_ms < max(seconds, 0.5) * 1000)

    def cut(self) -> None:
        """Unblock every reader and writer at once (a blocked send on a full buffer included)."""
        if isinstance(self.inner, socket.socket):
            try:
                self.inner.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self.inner.close()
        except Exception:  # closing a dead stream must never raise
            pass

    def __getattr__(self, name: str) -> Any:  # Any: whatever else paramiko asks of the stream, passed through
        return getattr(self.inner, name)


class Watchdog(threading.Thread):
    """Keepalives with a bounded number of missed replies (see the module docstring)."""

    def __init__(self, conn: Watched, transport: paramiko.Transport, stream: WatchedSocket,
                 interval: float, count_max: int) -> None:
        super().__init__(name=f"edgetk-watchdog-{conn.name}", daemon=True)
        self.conn = conn
        self.transport = transport
        self.stream = stream
        self.interval = interval
        self.count_max = count_max
        self.done = threading.Event()
        self._pinger: threading.Thread | None = None

    def _ping(self) -> None:
        try:  # any reply (OpenSSH answers "request failure") is a byte from the server
            self.transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:  # a dying transport: the watchdog or the caller notices
            pass

    def run(self) -> None:
        tick = min(1.0, self.interval / 2)
        while not self.done.wait(tick):
            if not self.transport.is_active():
                return
            silent = time.monotonic() - self.stream.last_recv
            if silent >= self.interval * self.count_max:
                what = f"no reply to {self.count_max} keepalives in {self.interval * self.count_max:.0f} s"
                # nothing acknowledged either: the link itself is gone; else the device stopped answering
                self.conn.watchdog_cut(what, link_gone=self.stream.peer_acks_within(silent - 1.0) is False)
                self.stream.cut()
                threading.Thread(target=self.transport.close, daemon=True).start()
                return
            if silent >= self.interval and (self._pinger is None or not self._pinger.is_alive()):
                self._pinger = threading.Thread(target=self._ping, name="edgetk-keepalive", daemon=True)
                self._pinger.start()
