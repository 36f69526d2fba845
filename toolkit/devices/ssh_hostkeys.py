"""Host keys, as ``ssh`` checks them: the known_hosts files (the device's ``known_hosts``/``--known-hosts``, else
UserKnownHostsFile and GlobalKnownHostsFile). An unknown host is refused unless ``trust_new_host`` (or
``StrictHostKeyChecking accept-new``; ``no`` is taken as ``accept-new``: edgetk never connects to a host whose
key CHANGED), in which case its key is appended to the first user file (hashed with ``HashKnownHosts yes``).

paramiko ships no type information: its keys and transports are ``Any`` here.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import paramiko

from toolkit.devices.ssh_config import SshOptions
from toolkit.errors import HostKeyRefused


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint, what ``ssh-keygen -lf`` prints."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def home_relative(path: str | os.PathLike[str]) -> str:
    """``path`` as ``~/...`` when it is under the home directory (as messages show it)."""
    text = str(path)
    home = str(Path.home())
    return "~" + text[len(home):] if text.startswith(home + os.sep) else text


def known_files(opts: SshOptions, known_hosts: Path | None) -> tuple[list[Path], list[Path]]:
    """(files to read, in order; the file a trusted key is written to first)."""
    if known_hosts is not None:
        return [known_hosts], [known_hosts]
    return [*opts.user_known_hosts, *opts.global_known_hosts], list(opts.user_known_hosts)


def host_keys(device: str, files: list[Path]) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    for path in files:
        if path.is_file():
            try:
                keys.load(str(path))
            except (OSError, paramiko.SSHException) as exc:
                raise HostKeyRefused(f"{device}: cannot read {path} ({exc}).") from None
    return keys


def prefer_known_key_types(device: str, transport: paramiko.Transport, opts: SshOptions,
                           known_hosts: Path | None) -> None:
    """Ask first for the key type known_hosts holds for this host (as ssh does), so that a host known by
    its RSA key is not refused because it also has an ed25519 one."""
    known = host_keys(device, known_files(opts, known_hosts)[0]).lookup(opts.host_key_name)
    if known:
        options = transport.get_security_options()
        first = [k for k in known.keys() if k in options.key_types]
        options.key_types = first + [k for k in options.key_types if k not in first]


def check_host_key(device: str, transport: paramiko.Transport, opts: SshOptions, *, known_hosts: Path | None,
                   trust_new_host: bool) -> None:
    """Accept the server's key when known_hosts holds it; record a new one when trusted; refuse otherwise."""
    key = transport.get_remote_server_key()
    name = opts.host_key_name
    read, write = known_files(opts, known_hosts)
    known = host_keys(device, read).lookup(name)
    where = ", ".join(home_relative(p) for p in read[:2]) or "no known_hosts file"
    if known and key.get_name() in known and known[key.get_name()] == key:
        return
    if known:
        expected = next(iter(known.values()))
        raise HostKeyRefused(
            f"{device}: the host key of {name} CHANGED: {where} has {fingerprint(expected)}, the host now "
            f"offers {fingerprint(key)}. Refusing to connect.",
            hint="If the device was re-imaged, check the new fingerprint on its console, then remove the old "
            f"entry with: ssh-keygen -R '{name}' -f {write[0] if write else read[0]}. Otherwise someone may "
            "be intercepting the connection.",
        )
    if not (trust_new_host or opts.strict_host_key_checking == "accept-new"):
        raise HostKeyRefused(
            f"{device}: the host {name} is not in {where} (it offers the {key.get_name()} key "
            f"{fingerprint(key)}).",
            hint="Check that fingerprint on the device (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then "
            "re-run with --trust-new-host to record it.",
        )
    if not write:
        raise HostKeyRefused(f"{device}: the host {name} is unknown and UserKnownHostsFile is none: "
                             "there is nowhere to record its key.", hint="Pass --known-hosts FILE.")
    entry = paramiko.HostKeys.hash_host(name) if opts.hash_known_hosts else name
    target = write[0]
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as handle:
        handle.write(f"{entry} {key.get_name()} {key.get_base64()}\n")
