"""Device specs: what a user types after ``--device`` (or names in an inventory) -> a frozen :class:`DeviceSpec`.

Accepted forms: ``local`` (this machine, no SSH), ``user@host``, ``user@host:port``, ``host[:port]``,
``user@[v6addr]:port``, a Host alias from ``~/.ssh/config`` (resolved when the SSH connection opens, so
HostName/User/Port/IdentityFile/ProxyJump come from there), or a device name from an inventory file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from toolkit.errors import UsageError

LOCAL = "local"
DEFAULT_HOME = ".edgetk"  # the toolkit's files on a device: relative paths are under the login's home directory

_SPEC = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+))"
    r"(?::(?P<port>[0-9]{1,5}))?$"
)


@dataclass(frozen=True)
class DeviceSpec:
    """Everything edgetk knows about one device before connecting to it.

    ``host`` is None for the local machine. ``port``/``user``/``identity_file`` None mean "from ~/.ssh/config,
    else the SSH defaults". ``python`` None means ``<home>/config.json``'s python, else ``python3``. ``home`` is
    where the toolkit keeps its files on the device (None: ``~/.edgetk``; a device with a read-only root sets a
    writable place such as ``/data/edgetk``): see :func:`device_home`.
    """

    name: str
    host: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    python: str | None = None
    target: str | None = None
    groups: tuple[str, ...] = ()
    known_hosts: str | None = None
    proxy_jump: str | None = None
    home: str | None = None

    @property
    def base(self) -> str:
        """The toolkit's directory on the device as the connection's paths say it (relative: under the home)."""
        return device_home(self.home)

    @property
    def is_local(self) -> bool:
        return self.host is None

    def __str__(self) -> str:
        return self.name


def device_home(value: str | None, *, where: str = "home") -> str:
    """``value`` (inventory ``home``, ``--device-home``) as a connection path: None -> ``.edgetk``; ``~/x`` and
    ``x`` -> ``x`` (relative to the login's home); an absolute path as it is, without a trailing slash."""
    if value is None:
        return DEFAULT_HOME
    text = value.strip()
    if text in ("~", "~/"):
        text = ""
    elif text.startswith("~/"):
        text = text[2:]
    text = text.rstrip("/") if text != "/" else text
    if (not text or text == "/" or text.startswith("~") or "\n" in text or "\x00" in text
            or ".." in text.split("/")):
        raise UsageError(f"{where}: {value!r} cannot be the toolkit's directory on a device.",
                         hint='Give a directory of its own, absolute or under the home: home = "/data/edgetk".')
    return text


def port_number(value: object, where: str) -> int:
    """A TCP port as written (a number or its text) checked to 1-65535; ``where`` names it in the message."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UsageError(f"{where}: the port must be a number between 1 and 65535, got {value!r}.")
    try:
        port = int(value)
    except ValueError:
        raise UsageError(f"{where}: the port must be a number between 1 and 65535, got {value!r}.") from None
    if not 1 <= port <= 65535:
        raise UsageError(f"{where}: the port must be between 1 and 65535, got {port}.")
    return port


def parse_spec(text: str, *, inventory: Mapping[str, DeviceSpec] | None = None) -> DeviceSpec:
    """Turn one ``--device`` value into a DeviceSpec; inventory names win over host names."""
    text = text.strip()
    if inventory and text in inventory:
        return inventory[text]
    if text == LOCAL:
        return DeviceSpec(name=LOCAL)
    match = _SPEC.match(text)
    if not match:
        raise UsageError(
            f"{text!r} is not a device spec.",
            hint="Use local, user@host[:port], a Host alias from ~/.ssh/config, or a name from --inventory.",
        )
    port = port_number(match["port"], f"device {text!r}") if match["port"] else None
    return DeviceSpec(name=text, host=match["v6"] or match["host"], port=port, user=match["user"])
