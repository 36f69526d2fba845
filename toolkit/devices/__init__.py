"""Devices: how edgetk reaches a device (``local`` or SSH), names it (spec, inventory) and works on many at once.

``connection.Connection`` is the one interface the deploy and check stages use; ``local.LocalConnection`` and
``ssh.SshConnection`` implement it. paramiko is imported only by ``ssh`` (and only when a connection to an SSH
device is opened), so deploy-only use of ``local`` and ``edgetk --help`` stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.devices.spec import DeviceSpec, parse_spec

if TYPE_CHECKING:
    from toolkit.devices.connection import Connection

__all__ = ["DeviceSpec", "open_connection", "parse_spec"]


def open_connection(
    spec: DeviceSpec,
    *,
    trust_new_host: bool = False,
    known_hosts: str | None = None,
    connect_timeout: float | None = None,
) -> Connection:
    """A lazily connecting connection to ``spec`` (nothing touches the network until the first command)."""
    if spec.is_local:
        from toolkit.devices.local import LocalConnection

        return LocalConnection(spec)
    from toolkit.devices.ssh import SshConnection

    return SshConnection(
        spec,
        trust_new_host=trust_new_host,
        known_hosts=known_hosts or spec.known_hosts,
        connect_timeout=connect_timeout,
        proxy_jump=spec.proxy_jump,
    )
