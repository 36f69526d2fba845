"""Ansible inventories as device lists: ``--inventory hosts.ini | hosts.yml | inventory_dir/``.

Ansible parses the inventory, not us: ``ansible-inventory -i INV --list [--limit PATTERN]`` (ansible-core, the
``[ansible]`` extra) prints every host with its merged variables and groups as JSON, so INI, YAML, directories
with group_vars/host_vars, plugins and ``--limit`` patterns (``lab:&arm64:!pi-3``) mean exactly what they mean
to ``ansible-playbook``. Each host becomes a :class:`DeviceSpec`:

=================================================  =====================
Ansible variable                                   DeviceSpec field
=================================================  =====================
``ansible_host`` (else the inventory host name)    ``host``
``ansible_port``                                   ``port``
``ansible_user``                                   ``user``
``ansible_ssh_private_key_file``                   ``identity_file``
``ansible_python_interpreter``                     ``python``
``ansible_ssh_common_args`` / ``_extra_args``      ``proxy_jump`` (``-J`` / ``-o ProxyJump=``)
``ansible_connection: local``                      the ``local`` device
groups (with their parents, except ``all``)        ``groups``
``edgetk_<field>`` (``edgetk_target``, ...)        that field; wins over the ``ansible_*`` one
=================================================  =====================

Other ssh options in ``ansible_ssh_common_args`` are not applied (edgetk's own host-key policy stays) and
are named in a warning.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolkit.devices.spec import DeviceSpec, port_number
from toolkit.errors import MissingDependency, UsageError
from toolkit.model.schemas.problems import closest

log = logging.getLogger(__name__)

_OURS = ("host", "port", "user", "identity_file", "python", "target", "known_hosts", "proxy_jump", "home")
_ANSIBLE = {
    "host": ("ansible_host", "ansible_ssh_host"),
    "port": ("ansible_port", "ansible_ssh_port"),
    "user": ("ansible_user", "ansible_ssh_user"),
    "identity_file": ("ansible_ssh_private_key_file", "ansible_private_key_file"),
    "python": ("ansible_python_interpreter",),
}
_TIMEOUT_S = 120.0


def is_ansible_inventory(path: Path) -> bool:
    """A directory, or a file that is not ``.toml`` (hosts, hosts.ini, hosts.yml, inventory.json, ...)."""
    return path.is_dir() or path.suffix.lower() != ".toml"


def _executable() -> str:
    beside = Path(sys.executable).with_name("ansible-inventory")  # the same virtualenv as edgetk
    found = str(beside) if beside.is_file() else shutil.which("ansible-inventory")
    if found is None:
        raise MissingDependency("ansible-core", extra="ansible", purpose="Reading an Ansible inventory")
    return found


def ansible_list(path: Path, *, limit: str | None = None) -> dict[str, Any]:  # Any: JSON
    """``ansible-inventory -i PATH --list`` as parsed JSON; an inventory Ansible cannot parse is an error."""
    argv = [_executable(), "-i", str(path), "--list"]
    if limit:
        argv += ["--limit", limit]
    with tempfile.TemporaryDirectory(prefix="edgetk-ansible-") as tmp:
        env = dict(os.environ)
        env.update(
            ANSIBLE_INVENTORY_UNPARSED_FAILED="True",  # a file no plugin parses: an error, not an empty fleet
            ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="True",
            ANSIBLE_LOCALHOST_WARNING="False",
            ANSIBLE_LOCAL_TEMP=tmp,
            ANSIBLE_NOCOLOR="1",
        )
        if "utf" not in (env.get("LC_ALL") or env.get("LANG") or "").lower():
            env["LC_ALL"] = "C.UTF-8"  # ansible-core refuses to start under a non-UTF-8 locale
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise UsageError(f"ansible-inventory did not finish reading {path} within {_TIMEOUT_S:.0f} s.") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("[WARNING]")]
        reason = " ".join(lines)[-400:] or f"exit code {proc.returncode}"
        raise UsageError(f"Ansible could not read the inventory {path}: {reason}",
                         hint="Check it with: ansible-inventory -i INVENTORY --list")
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise UsageError(f"ansible-inventory printed no JSON for {path}.") from None
    if not isinstance(data, dict):
        raise UsageError(f"ansible-inventory printed unexpected JSON for {path}.")
    return data


def _group_members(data: Mapping[str, Any]) -> dict[str, set[str]]:  # Any: JSON
    """Every group -> its hosts, including those of its child groups."""
    direct = {g: set(v.get("hosts") or ()) for g, v in data.items() if g != "_meta" and isinstance(v, dict)}
    children = {g: list(v.get("children") or ()) for g, v in data.items() if g != "_meta" and isinstance(v, dict)}

    def hosts(group: str, seen: frozenset[str]) -> set[str]:
        out = set(direct.get(group, ()))
        for child in children.get(group, ()):
            if child not in seen:
                out |= hosts(child, seen | {child})
        return out

    return {g: hosts(g, frozenset({g})) for g in direct}


def _host_order(data: Mapping[str, Any]) -> list[str]:  # Any: JSON
    """Every host, in natural name order (pi-2 before pi-10): ``ansible-inventory --list`` keeps no file order,
    and a staged rollout's first wave must not depend on a dict's whims."""
    import re

    hosts = set((data.get("_meta") or {}).get("hostvars") or {})
    for group, value in data.items():
        if group != "_meta" and isinstance(value, dict):
            hosts.update(value.get("hosts") or ())
    return sorted(hosts, key=lambda h: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", h)])


def _proxy_jump(args: str, where: str) -> str | None:
    """ProxyJump from ssh command-line arguments (``-J X``, ``-o ProxyJump=X``); other options are warned of."""
    try:
        words = shlex.split(args)
    except ValueError as exc:
        raise UsageError(f"{where}: ansible_ssh_common_args is not valid shell words ({exc}).") from None
    jump, ignored = None, []
    i = 0
    while i < len(words):
        word = words[i]
        value: str | None = None
        if word == "-J" and i + 1 < len(words):
            jump, i = words[i + 1], i + 2
            continue
        if word.startswith("-J") and len(word) > 2:
            jump, i = word[2:], i + 1
            continue
        if word == "-o" and i + 1 < len(words):
            value, i = words[i + 1], i + 2
        elif word.startswith("-o") and len(word) > 2:
            value, i = word[2:], i + 1
        else:
            ignored.append(word)
            i += 1
            continue
        key, _, val = value.replace(" ", "=", 1).partition("=")
        if key.lower() == "proxyjump":
            jump = val.strip()
        else:
            ignored.append(f"-o {value}")
    if ignored:
        log.warning("%s: ssh options not applied by edgetk: %s", where, " ".join(ignored))
    return jump or None


def _text(value: object, key: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise UsageError(f"{where}: {key} must be a non-empty string, got {value!r}.")
    return str(value)


def host_spec(name: str, hostvars: Mapping[str, Any], groups: tuple[str, ...], *, where: str) -> DeviceSpec:
    """One Ansible host (its merged variables: JSON, hence Any) -> a DeviceSpec."""
    here = f"{where}: host {name}"
    fields: dict[str, Any] = {}  # Any: JSON
    for key, aliases in _ANSIBLE.items():
        for alias in aliases:
            if hostvars.get(alias) not in (None, ""):
                fields[key] = hostvars[alias]
                break
    common = " ".join(str(hostvars[k]) for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args")
                      if hostvars.get(k))
    if common:
        fields["proxy_jump"] = _proxy_jump(common, here)
    extra_groups: list[str] = []
    for key, value in hostvars.items():
        if not key.startswith("edgetk_"):
            continue
        ours = key[len("edgetk_"):]
        if ours == "groups":
            if not isinstance(value, list) or not all(isinstance(g, str) and g for g in value):
                raise UsageError(f"{here}: edgetk_groups must be a list of names, got {value!r}.")
            extra_groups.extend(value)
            continue
        if ours not in _OURS:
            close = closest(ours, _OURS)
            raise UsageError(
                f"{here}: unknown variable {key!r}.",
                hint=(f"Did you mean 'edgetk_{close}'? " if close else "")
                + "edgetk_ variables: " + ", ".join(f"edgetk_{k}" for k in (*_OURS, "groups")) + ".",
            )
        fields[ours] = value
    local = str(hostvars.get("ansible_connection") or "") == "local" or fields.get("host") == "local"
    port = fields.get("port")
    return DeviceSpec(
        name=name,
        host=None if local else _text(fields.get("host", name), "the host", here),
        port=None if port is None or local else port_number(port, f"{here} ansible_port"),
        user=None if fields.get("user") is None else _text(fields["user"], "ansible_user", here),
        identity_file=None if fields.get("identity_file") is None else os.path.expanduser(
            _text(fields["identity_file"], "ansible_ssh_private_key_file", here)),
        python=None if fields.get("python") is None else _text(fields["python"], "the python", here),
        target=None if fields.get("target") is None else _text(fields["target"], "edgetk_target", here),
        groups=tuple(dict.fromkeys([*groups, *extra_groups])),
        known_hosts=None if fields.get("known_hosts") is None else _text(fields["known_hosts"], "edgetk_known_hosts",
                                                                         here),
        proxy_jump=None if fields.get("proxy_jump") is None else _text(fields["proxy_jump"], "ProxyJump", here),
        home=None if fields.get("home") is None else _home(_text(fields["home"], "edgetk_home", here), here),
    )


def _home(value: str, here: str) -> str:
    """``edgetk_home`` as written, once :func:`toolkit.devices.spec.device_home` accepts it."""
    from toolkit.devices.spec import device_home

    device_home(value, where=f"{here} edgetk_home")
    return value


def load_ansible_inventory(path: Path, *, limit: str | None = None) -> dict[str, DeviceSpec]:
    """The inventory's hosts (narrowed by the ``limit`` pattern) as DeviceSpecs, in natural name order."""
    if not path.exists():
        raise UsageError(f"The inventory {path} does not exist.", hint="Check the --inventory path.")
    data = ansible_list(path, limit=limit)
    hostvars = (data.get("_meta") or {}).get("hostvars") or {}
    members = _group_members(data)
    order = _host_order(data)
    if not order:
        raise UsageError(
            f"{path}: no hosts" + (f" match --limit {limit!r}." if limit else "."),
            hint="List them with: ansible-inventory -i INVENTORY --graph",
        )
    out = {}
    for host in order:
        groups = tuple(sorted(g for g, hosts in members.items() if host in hosts and g not in ("all", "ungrouped")))
        out[host] = host_spec(host, hostvars.get(host) or {}, groups, where=str(path))
    return out
