"""Sending a stream on a paramiko channel in whole windows, each packet sent the moment its window opens: the
send path of a push over an exec channel (no SFTP: Dropbear devices).

Dropbear grants a 24 KiB receive window and returns it packet by packet, after writing each packet out (once
that is 8 KiB or more; its ``writechannel``), so a push to it is a stop-and-wait of one packet at a time and the
time of each round trip through this side decides the speed (docs/benchmarks.md, "Push speed"). Measured on the
stand-in, per 24 KiB packet: 200 us on the device's side, and on this side 60 us to build and seal the next
packet plus 25-85 us to hand it from paramiko's transport thread (which reads the window adjustment) to the
sending thread. Three things cut that:

- **Whole windows** (:class:`WindowSender`): paramiko's ``sendall`` sends as soon as any window is open, as
  much as it holds; the short tail of each block handed to it then splits the window for good (the server
  returns it in the same pieces), and a third of a 50 MB push's packets were 8-16 KiB, each a full round trip.
  The sender waits for a whole packet (the smaller of the server's largest packet and its first window) and
  carries each block's tail into the next block. A server that holds back part of its window until it gets
  more data (Dropbear, when its pipe to the command is full) gets that part after ``HOLD_S``. A server with a
  large window (OpenSSH: 2 MiB) is never waited for.
- **Sealed ahead**: while the window is waited for, the next packet is built and sealed (ChaCha20-Poly1305:
  ``ChachaPacketizer.seal_ahead``), and sent as sealed when it goes next with the same keys and sequence number.
- **Sent on the window adjustment**: the transport's thread sends that packet itself right after reading the
  adjustment that makes room for it (:meth:`WindowSender.pump`, through ``WINDOW_PUMP_HANDLERS``, the channel
  handlers of the toolkit's transport); it never waits or raises there, and the sending thread covers every
  other case (paramiko's own transport included).

Tried and left out: a second exec channel of the same connection for the second half of a large file (two
windows open, two packets in flight; the helper took that half from a file after the first). At 50 MB on the 2
shared cores it gained nothing at load 4-6 (1.58 s vs 1.57 s on one channel, 1.68 s vs 1.69 s) and lost at load 2
(1.31 s vs 1.16 s), because CPU decides, not the round trips: either push takes 0.7-0.8 s of this side's CPU and
0.75-0.85 s of the device's, ``ssh cat`` 0.25 s and 0.45 s. Two senders also defeat sealing ahead (both guess the
same sequence number). What was done instead: a bundle of 32 MiB or more streams through the system ``ssh``
client (:mod:`toolkit.devices.ssh_client`), which spends about half this side's CPU per packet.

paramiko ships no type information: its channels, transports and messages type-check as anything here.
"""

from __future__ import annotations

import struct
import threading
import time
import paramiko
from paramiko.common import MSG_CHANNEL_WINDOW_ADJUST, cMSG_CHANNEL_DATA

from toolkit.compat import paramiko as paramiko_compat

PACKET_HEADROOM = 64  # paramiko keeps this much of the server's largest packet for the packet's own fields
DATA = bytes(cMSG_CHANNEL_DATA)
HOLD_S = 0.001  # how long a part of a packet's window waits for the rest (a round trip on the stand-in: 0.3 ms)


class WindowSender:
    """Sends blocks on ``chan`` (an open paramiko session channel, nothing sent on it yet) in whole packets.
    Blocks go out in order; the tail of a block shorter than a packet waits for the next block or ``flush``."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self.chan = chan
        with chan.lock:
            largest = max(1, chan.out_max_packet_size - PACKET_HEADROOM)
            self.packet = min(largest, chan.out_window_size or largest)
        self.tail = b""
        self.transport = chan.get_transport()
        self.seal_ahead = getattr(self.transport.packetizer, "seal_ahead", None)
        self._ready: memoryview | None = None  # the next packet's data, until one of the two threads sends it
        self._sending = threading.Lock()
        chan.window_pump = self.pump  # called on each window adjustment (WINDOW_PUMP_HANDLERS)

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
            try:
                self._wait_for(size)
            except BaseException:
                with self._sending:
                    self._ready = None  # not sent: nor by the transport's thread later
                raise
            with self._sending:
                ready, self._ready = self._ready, None
                sent = size if ready is None else self.chan.send(ready)
            if sent == 0:
                raise OSError("the channel closed while sending")
            view = view[sent:]

    def pump(self) -> None:
        """Send the next packet at once if the window now holds it: called by the transport's thread right after
        it reads a window adjustment (``WINDOW_PUMP_HANDLERS``), which spares the hand-over to the sending thread. It
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


def _adjust_then_pump(chan: paramiko.Channel, message: paramiko.Message) -> None:
    paramiko_compat.adjust_window(chan, message)
    pump = getattr(chan, "window_pump", None)
    if pump is not None:
        pump()


# a transport class's ``_channel_handler_table``: paramiko's, a window adjustment also calling the channel's pump
WINDOW_PUMP_HANDLERS = {**paramiko_compat.channel_handlers(), MSG_CHANNEL_WINDOW_ADJUST: _adjust_then_pump}
