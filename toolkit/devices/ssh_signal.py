"""The signal that killed a command on an SSH device. An SSH server reports a command killed by a signal with an
``exit-signal`` request (RFC 4254, 6.10: the signal's name without ``SIG``, whether it dumped core) instead of
an ``exit-status``; paramiko drops that request, so a command the kernel's OOM killer ended read as "exit
status -1" and its fate was lost. :data:`CHANNEL_HANDLERS` (the toolkit transport's channel handlers,
:class:`toolkit.devices.ssh_chacha.ChachaTransport`) reads it into the channel's ``exit_signal`` and hands
every other request to paramiko; :func:`signal_status` turns it into the negative status ``subprocess`` gives.
"""

from __future__ import annotations

import signal
import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST

from toolkit.compat import paramiko as paramiko_compat
from toolkit.devices.ssh_window import WINDOW_PUMP_HANDLERS


def _request(chan: paramiko.Channel, message: paramiko.Message) -> None:
    start = message.packet.tell()
    if message.get_text() == "exit-signal":
        message.get_boolean()  # want-reply: always false for exit-signal
        chan.exit_signal = message.get_text()
        chan.exit_core_dumped = message.get_boolean()
        chan.status_event.set()
        return
    message.packet.seek(start)
    paramiko_compat.handle_channel_request(chan, message)


def signal_status(chan: paramiko.Channel, status: int) -> tuple[int, str | None]:
    """(status, signal name) of the ended command on ``chan``: ``-SIGNUM`` and ``"SIGKILL"`` after a signal (-1
    for a signal this host does not number), else ``status`` and None."""
    name = getattr(chan, "exit_signal", None)
    if not name:
        return status, None
    full = name if name.startswith("SIG") else f"SIG{name}"
    try:
        return -signal.Signals[full].value, full
    except KeyError:
        return -1, full


# a transport class's ``_channel_handler_table``: the window pump's (ssh_window), and exit-signal read
CHANNEL_HANDLERS = {**WINDOW_PUMP_HANDLERS, MSG_CHANNEL_REQUEST: _request}
