"""Sending a stream on a paramiko channel in whole windows: one SSH packet per window the server grants, not
one per piece of it.

paramiko's ``Channel.sendall`` sends as soon as any window is open, as much as it holds. Against a server with a
small receive window that it returns packet by packet (Dropbear: 24 KiB, returned after each packet it has
written out, once that is 8 KiB or more; its ``writechannel``), one short packet splits the window for good: the
end of each block handed to ``sendall`` goes out short, the server returns the window in the same pieces, and
each piece comes back as a packet of its own. On the Dropbear stand-in a third of a 50 MB push's packets were
8-16 KiB, each costing a round trip through paramiko's Python as a full one does (docs/benchmarks.md, "Push
speed").

:class:`WindowSender` waits until the window holds a whole packet (the smaller of the channel's largest packet
and its first window, or what is left to send) before sending, and carries the tail of each block into the next
one, so every packet but the last is whole. A server with a large window (OpenSSH: 2 MiB) is never waited for:
its window always holds a packet. paramiko ships no type information: the channel is ``Any``.
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

import paramiko
from paramiko.common import MSG_CHANNEL_WINDOW_ADJUST, cMSG_CHANNEL_DATA

PACKET_HEADROOM = 64  # paramiko keeps this much of the server's largest packet for the packet's own fields
DATA = bytes(cMSG_CHANNEL_DATA)
HOLD_S = 0.005  # how long a part of a packet's window may wait for the rest (a round trip here: 0.3 ms)


class WindowSender:
    """Sends blocks on ``chan`` (an open paramiko session channel, nothing sent on it yet) in whole packets.
    Blocks go out in order; the tail of a block shorter than a packet waits for the next block or ``flush``."""

    def __init__(self, chan: Any) -> None:  # Any: paramiko.Channel
        self.chan = chan
        with chan.lock:
            largest = max(1, chan.out_max_packet_size - PACKET_HEADROOM)
            self.packet = min(largest, chan.out_window_size or largest)
        self.tail = b""
        self.transport = chan.get_transport()
        self.seal_ahead = getattr(self.transport.packetizer, "seal_ahead", None)
        self._ready: memoryview | None = None  # the next packet's data, until one of the two threads sends it
        self._sending = threading.Lock()
        chan.window_pump = self.pump  # read by PumpingHandlers' window adjustment

    def send(self, block: bytes) -> None:
        """Send ``block`` after what is carried, in whole packets; carry what is left under one packet."""
        view = memoryview(block)
        if self.tail:
            need = self.packet - len(self.tail)
            if len(view) < need:
                self.tail += bytes(view)
                return
            self._send(memoryview(self.tail + bytes(view[:need])))
            view = view[need:]
        whole = len(view) - len(view) % self.packet
        self._send(view[:whole])
        self.tail = bytes(view[whole:])

    def flush(self) -> None:
        """Send what is carried."""
        tail, self.tail = self.tail, b""
        self._send(memoryview(tail))

    def _send(self, view: memoryview) -> None:
        while view:
            size = min(len(view), self.packet)
            if self.seal_ahead is not None:
                self.seal_ahead(DATA + struct.pack(">II", self.chan.remote_chanid, size) + view[:size])
            self._ready = view[:size]  # from now on the transport's thread may send it (``pump``)
            self._wait_for(size)
            with self._sending:
                ready, self._ready = self._ready, None
                sent = size if ready is None else self.chan.send(ready)
            if sent == 0:
                raise OSError("the channel closed while sending")
            view = view[sent:]

    def pump(self) -> None:
        """Send the next packet at once if the window now holds it: called by the transport's thread right after
        it reads a window adjustment (``PumpingHandlers``), which spares the hand-over to the sending thread. It
        never waits (a busy sender, a key exchange under way, a short window: the sending thread sends) and
        never raises into the transport's thread (the sending thread meets the same error)."""
        chan = self.chan
        if self._ready is None or not self._sending.acquire(blocking=False):
            return
        sent = 0
        try:
            ready = self._ready
            if ready is not None and chan.out_window_size >= len(ready) and self.transport.clear_to_send.is_set():
                sent = chan.send(ready)
                if sent:
                    self._ready = None
        except Exception:  # noqa: BLE001, S110 - the sending thread sends it and meets the error itself
            pass
        finally:
            self._sending.release()
        if sent:
            with chan.lock:
                chan.out_buffer_cv.notify_all()  # the sending thread, waiting for this window, prepares the next

    def _wait_for(self, size: int) -> None:
        """Wait until the window holds ``size`` bytes, or the channel closes (``send`` then says so). A server
        may hold back part of its window until it has more data (Dropbear returns less than 8 KiB only with
        the next packet): when the window holds some bytes and grows no more for ``HOLD_S``, those go. An empty
        window is waited for up to the channel's timeout, then ``TimeoutError`` (as paramiko's own wait)."""
        chan = self.chan
        deadline = None if chan.timeout is None else time.monotonic() + chan.timeout
        with chan.lock:
            while self._ready is not None and chan.out_window_size < size and not (chan.closed or chan.eof_sent):
                window = chan.out_window_size
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("no window from the server")
                wait = left if not window else HOLD_S if left is None else min(left, HOLD_S)
                if not chan.out_buffer_cv.wait(wait) and window and chan.out_window_size == window:
                    return


def _adjust_then_pump(chan: Any, message: Any) -> None:  # Any: paramiko's Channel and Message
    paramiko.Channel._window_adjust(chan, message)
    pump = getattr(chan, "window_pump", None)
    if pump is not None:
        pump()


# a transport's handlers of channel messages (its class's ``_channel_handler_table``), a window adjustment also
# calling the channel's WindowSender
PumpingHandlers = {**paramiko.Transport._channel_handler_table, MSG_CHANNEL_WINDOW_ADJUST: _adjust_then_pump}
