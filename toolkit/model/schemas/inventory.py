"""The schema of the TOML device inventory (``--inventory devices.toml``, docs/devices.md)::

    [devices.pi-lab-1]
    host = "192.168.1.40"        # or an ~/.ssh/config alias, or "local" for this machine
    port = 22
    user = "pi"
    groups = ["lab", "line-2"]

Read by :mod:`toolkit.model.reading` (the one engine for records read from files).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from toolkit.model.reading import Before, Rule

DOCS = "docs/devices.md"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
LOCAL = "local"


def _port(value: object) -> object:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().lstrip("-").isdigit():
        raise ValueError(f"the port must be a number between 1 and 65535, got {value!r}.")
    port = int(value)
    if not 1 <= port <= 65535:
        raise ValueError(f"the port must be between 1 and 65535, got {port}.")
    return port


Text = Annotated[str, Rule(lambda v: bool(v.strip()), lambda v: f"must be a non-empty string, got {v!r}",
                           "Give it a value, or leave the key out.")]
DeviceName = Annotated[str, Rule(
    lambda v: bool(v) and set(v) <= _NAME_CHARS and v != LOCAL,
    lambda v: "the device name must use only letters, digits, '.', '_' and '-' (and not be 'local')",
    "Rename the [devices.NAME] table.")]


@dataclass(frozen=True)
class Device:
    """``[devices.NAME]``: where one device is and how to reach it."""

    host: Text  # "local" for this machine
    port: Annotated[int, Before(_port)] | None = None  # a number, or its digits as a string
    user: Text | None = None
    identity_file: Text | None = None
    python: Text | None = None
    target: Text | None = None
    groups: tuple[Text, ...] = ()
    known_hosts: Text | None = None
    home: Text | None = None  # where the toolkit keeps its files on the device (default ~/.edgetk)


@dataclass(frozen=True)
class Inventory:
    devices: Mapping[DeviceName, Device] = field(default_factory=dict)
