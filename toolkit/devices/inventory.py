"""The TOML inventory of devices (issue 5)::

    [devices.pi-lab-1]
    host = "192.168.1.40"        # or an ~/.ssh/config alias, or "local" for this machine
    port = 22
    user = "pi"
    identity_file = "~/.ssh/id_ed25519"
    python = "/home/pi/venv/bin/python"   # optional: else python3 on the device
    target = "raspberry-pi-4"
    groups = ["lab", "line-2"]
    known_hosts = "~/.ssh/known_hosts"     # optional
    home = "/data/edgetk"                  # optional: where the toolkit keeps its files (default ~/.edgetk)

Every error names the file, the table and the key, and an unknown key gets a "did you mean": the schema is a
record (toolkit.model.schemas.inventory) read by the one engine for records (toolkit.model.reading).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolkit.devices.spec import LOCAL, DeviceSpec, device_home
from toolkit.errors import UsageError
from toolkit.model.reading import read_file
from toolkit.model.schemas.inventory import DOCS, Device, Inventory


def _did_you_mean(key: str, choices: tuple[str, ...] | list[str]) -> str:
    from toolkit.model.schemas.problems import did_you_mean

    return did_you_mean(key, choices, sentence=True)


def _checked_home(value: str | None, *, where: str) -> str | None:
    """``home`` as written, once :func:`device_home` accepts it (the error names the file and the key)."""
    if value is not None:
        device_home(value, where=where)
    return value


def parse_inventory(data: Mapping[str, object], *, where: str) -> dict[str, DeviceSpec]:
    """Validate parsed TOML and return the devices by name (in file order)."""
    inventory = read_file(Inventory, data, file=where, docs=DOCS)
    if not inventory.devices:
        raise UsageError(
            f"{where}: no devices defined.",
            hint='Add at least one table like [devices.pi-1] with host = "192.168.1.40".',
        )
    return {
        name: DeviceSpec(
            name=name,
            host=None if entry.host == LOCAL else entry.host,
            port=entry.port,
            user=entry.user,
            identity_file=entry.identity_file,
            python=entry.python,
            target=entry.target,
            groups=tuple(entry.groups),
            known_hosts=entry.known_hosts,
            home=_checked_home(entry.home, where=f"{where}: [devices.{name}] home"),
        )
        for name, entry in inventory.devices.items()
    }


def load_inventory(path: Path, *, limit: str | None = None) -> dict[str, DeviceSpec]:
    """Read and validate an inventory file: TOML (``.toml``), else an Ansible inventory (file or directory,
    read by ``ansible-inventory``; ``limit`` is an Ansible host pattern)."""
    path = Path(path)
    from toolkit.devices.ansible_inventory import is_ansible_inventory, load_ansible_inventory

    if path.exists() and is_ansible_inventory(path):
        return load_ansible_inventory(path, limit=limit)
    if limit:
        raise UsageError("--limit takes an Ansible host pattern and needs an Ansible inventory.",
                         hint="Use --group NAME with a TOML inventory.")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"The inventory {path} does not exist.", hint="Check the --inventory path.") from None
    except OSError as exc:
        raise UsageError(f"Cannot read the inventory {path} ({exc.strerror or exc}).") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML ({exc}).", hint="Fix the syntax at the place named.") from None
    return parse_inventory(data, where=str(path))


def select(devices: Mapping[str, DeviceSpec], *, group: str | None, where: str) -> list[DeviceSpec]:
    """The devices of ``group`` (all when None); an unknown group is an error with a did-you-mean."""
    if group is None:
        return list(devices.values())
    chosen = [d for d in devices.values() if group in d.groups]
    if not chosen:
        known = sorted({g for d in devices.values() for g in d.groups})
        raise UsageError(
            f"{where}: no device is in the group {group!r}.",
            hint=f"{_did_you_mean(group, known)}Groups in this inventory: {', '.join(known) or 'none'}.",
        )
    return chosen


def resolve_specs(
    devices: Sequence[str | DeviceSpec], *, inventory: Path | None, group: str | None, limit: str | None = None
) -> tuple[DeviceSpec, ...]:
    """The devices named by ``--device`` specs (narrowed by ``group``) or, without any, the inventory's
    (``group`` selecting); in order, without duplicates."""
    from toolkit.devices.spec import parse_spec

    table = load_inventory(Path(inventory), limit=limit) if inventory else {}
    if limit and not inventory:
        raise UsageError("--limit needs --inventory.", hint="Pass --inventory hosts.ini --limit PATTERN.")
    if group and not inventory:
        raise UsageError("--group needs --inventory.", hint="Pass --inventory FILE --group NAME.")
    if devices:
        specs = [d if isinstance(d, DeviceSpec) else parse_spec(str(d), inventory=table) for d in devices]
        if group:
            specs = [s for s in specs if group in s.groups]
    elif inventory:
        specs = select(table, group=group, where=str(inventory))
    else:
        raise UsageError(
            "No device given.",
            hint="Pass --device SPEC (local, user@host[:port], an ssh alias) or --inventory FILE.",
        )
    return tuple({s.name: s for s in specs}.values())

