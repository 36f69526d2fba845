"""paramiko's private members that edgetk's SSH stack relies on (pinned: paramiko==5.1.0, pyproject.toml).

- The ChaCha20-Poly1305 transport (``devices/ssh_chacha``) extends paramiko's cipher table and its preferred
  order, and frames packets itself while that cipher is on: it reads and writes the Packetizer's name-mangled
  state (sequence numbers, rekey counters, the write lock).
- The window pump and the exit-signal reader (``devices/ssh_window``, ``ssh_signal``) wrap two of the Channel's
  message handlers in a transport's handler table.
- An agent at a configured IdentityAgent socket is opened on a socket we connected (``devices/ssh_auth``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import paramiko
import paramiko.agent

from toolkit.compat import Member

PIN = "paramiko==5.1.0"

PACKETIZER_FIELDS = (
    "block_engine_in", "block_engine_out", "compress_engine_in", "compress_engine_out", "need_rekey",
    "received_bytes", "received_bytes_overflow", "received_packets", "received_packets_overflow", "sent_bytes",
    "sent_packets", "sequence_number_in", "sequence_number_out", "write_lock",
)
_MANGLED = "_Packetizer__"  # Packetizer's double-underscore state, as Python mangles it

MEMBERS = (
    Member("paramiko:Transport", "_preferred_ciphers"),
    Member("paramiko:Transport", "_cipher_info"),
    Member("paramiko:Transport", "_channel_handler_table"),
    Member("paramiko:Channel", "_handle_request"),
    Member("paramiko:Channel", "_window_adjust"),
    Member("paramiko.agent:AgentSSH", "_connect"),
    Member("paramiko:Packetizer", "_trigger_rekey"),
    Member("paramiko:Packetizer", "_initial_kex_done", instance=True),
    *(Member("paramiko:Packetizer", _MANGLED + name, instance=True) for name in PACKETIZER_FIELDS),
)

# A handler in a transport's channel handler table: (channel, message) -> None.
Handler = Callable[[paramiko.Channel, paramiko.Message], None]


def preferred_ciphers() -> tuple[str, ...]:
    """paramiko's own cipher order (a Transport subclass puts its ciphers before these)."""
    return tuple(paramiko.Transport._preferred_ciphers)


def cipher_info() -> dict[str, dict[str, object]]:
    """paramiko's cipher table: name -> its record (a Transport subclass adds its ciphers to a copy)."""
    return dict(paramiko.Transport._cipher_info)


def channel_handlers() -> dict[int, Handler]:
    """paramiko's channel message handlers: message type -> handler (a Transport subclass replaces some in a copy)."""
    return dict(paramiko.Transport._channel_handler_table)


def handle_channel_request(chan: paramiko.Channel, message: paramiko.Message) -> None:
    """paramiko's own handling of a channel request (exec, exit-status, ...)."""
    paramiko.Channel._handle_request(chan, message)


def adjust_window(chan: paramiko.Channel, message: paramiko.Message) -> None:
    """paramiko's own handling of a window adjustment (more room to send on ``chan``)."""
    paramiko.Channel._window_adjust(chan, message)


def agent_on(sock: socket.socket) -> paramiko.agent.AgentSSH:
    """An SSH agent client on ``sock``, already connected to the agent's socket (paramiko opens only
    $SSH_AUTH_SOCK itself; an IdentityAgent elsewhere is connected by us)."""
    agent = paramiko.agent.AgentSSH()
    agent._connect(sock)
    return agent


def packetizer_field(packetizer: paramiko.Packetizer, name: str) -> Any:  # Any: the field's own type
    """The Packetizer's private field ``name`` (one of ``PACKETIZER_FIELDS``)."""
    return getattr(packetizer, _MANGLED + name)


def set_packetizer_field(packetizer: paramiko.Packetizer, name: str, value: object) -> None:
    """Set the Packetizer's private field ``name`` (one of ``PACKETIZER_FIELDS``)."""
    setattr(packetizer, _MANGLED + name, value)

