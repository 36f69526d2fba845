"""Who is who on an SSH link: the host proves itself by its key, we prove ourselves by ours.

Host keys are checked as ``ssh`` checks them, against the known_hosts files (the device's
``known_hosts``/``--known-hosts``, else UserKnownHostsFile and GlobalKnownHostsFile). An unknown host is refused
unless ``trust_new_host`` (or ``StrictHostKeyChecking accept-new``; ``no`` is taken as ``accept-new``: edgetk
never connects to a host whose key CHANGED), in which case its key is appended to the first user file (hashed
with ``HashKnownHosts yes``). The login is with public keys only (files, certificates, an agent), in ``ssh``'s
order; a refusal says what the server offered and what was tried, and how to install a key.

paramiko ships no type information: its keys and transports are ``Any`` here.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
from pathlib import Path

import paramiko

from toolkit.compat import paramiko as paramiko_compat
from toolkit.devices.ssh_config import SshOptions
from toolkit.errors import AuthRefused, HostKeyRefused

log = logging.getLogger(__name__)
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_ecdsa_sk", "id_ed25519_sk", "id_rsa", "id_dsa")


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


def _load_key(path: str, password: bytes | None, problems: list[str]) -> paramiko.PKey | None:
    """The private key at ``path`` without any certificate, or None (the reason goes to ``problems``)."""
    try:
        loaded = paramiko.PKey.from_path(path, password)
        return type(loaded).from_private_key_file(path, password=password)
    except TypeError:  # cryptography: "Key is password-protected, but password was not provided"
        problems.append(f"encrypted:{path}")
    except (paramiko.SSHException, ValueError) as exc:
        problems.append(f"undecryptable:{path}" if password else f"unreadable:{path}:{exc}")
    except OSError as exc:
        problems.append(f"unreadable:{path}:{exc.strerror or exc}")
    return None


def _with_certificate(path: str, password: bytes | None, certificate: str) -> paramiko.PKey | None:
    try:
        key = paramiko.PKey.from_path(path, password)
        key.load_certificate(certificate)
    except (ValueError, TypeError, paramiko.SSHException, OSError):
        return None  # a certificate for another key, or an unreadable one
    return key


def _agent_keys(device: str, opts: SshOptions) -> list[paramiko.AgentKey]:
    if not opts.identity_agent:
        return []
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5)
        sock.connect(os.path.expanduser(opts.identity_agent))
        agent = paramiko_compat.agent_on(sock)
        return list(agent.get_keys())
    except (OSError, paramiko.SSHException) as exc:
        log.warning("%s: the SSH agent at %s did not answer (%s)", device, opts.identity_agent, exc)
        sock.close()
        return []


def _candidates(device: str, opts: SshOptions, password: bytes | None,
                problems: list[str]) -> list[tuple[str, paramiko.PKey]]:
    """(description, key) in ssh's order: identity files (with their certificates), then agent keys."""
    home = Path.home()
    files = list(opts.identity_files)
    if opts.default_identities:
        files += [str(home / ".ssh" / n) for n in DEFAULT_KEYS if (home / ".ssh" / n).is_file()]
    file_keys: list[tuple[str, paramiko.PKey]] = []
    public_blobs: set[bytes] = set()
    for path in files:
        pub = Path(path + ".pub")
        if pub.is_file():
            try:
                public_blobs.add(base64.b64decode(pub.read_text().split()[1]))
            except (IndexError, ValueError, OSError):
                pass
        key = _load_key(path, password, problems)
        if key is None:
            continue
        public_blobs.add(key.asbytes())
        cert = Path(path + "-cert.pub")
        for candidate in dict.fromkeys([*opts.certificate_files, *([str(cert)] if cert.is_file() else [])]):
            with_cert = _with_certificate(path, password, candidate)
            if with_cert is not None:
                file_keys.append((f"certificate {home_relative(candidate)}", with_cert))
        file_keys.append((f"key {home_relative(path)}", key))
    agent = [(f"agent key {k.comment or fingerprint(k)}", k) for k in _agent_keys(device, opts)
             if not opts.identities_only or k.asbytes() in public_blobs
             or any(k.asbytes() == fk.asbytes() for _, fk in file_keys)]
    if opts.identities_only and not files:
        agent = []
    # the agent holds the private half of an encrypted identity file: prefer it over failing on the file
    return file_keys + agent


def authenticate(device: str, transport: paramiko.Transport, opts: SshOptions, timeout: float, *,
                 passphrase: str | None) -> None:
    """Log in with the first key the server takes, or raise ``AuthRefused`` saying why none did."""
    transport.auth_timeout = timeout
    where = f"{opts.user}@{opts.hostname}" + ("" if opts.port == 22 else f":{opts.port}")
    copy_id = f"ssh-copy-id {'-p ' + str(opts.port) + ' ' if opts.port != 22 else ''}" \
              f"-i {home_relative(opts.identity_files[0]) if opts.identity_files else '~/.ssh/id_ed25519'}.pub " \
              f"{opts.user}@{opts.hostname}"
    copy_id = f"edgetk devices add-key --device {device} (or {copy_id})"  # a password login is enough
    try:
        transport.auth_none(opts.user)
        return  # the server lets us in without credentials
    except paramiko.BadAuthenticationType as exc:
        offered = list(exc.allowed_types)
    except paramiko.AuthenticationException:
        offered = ["publickey"]
    if "publickey" not in offered:
        raise AuthRefused(
            f"{device}: {where} does not accept keys (it offers: {', '.join(offered) or 'nothing'}); "
            "edgetk logs in with keys only.",
            hint=f"Enable PubkeyAuthentication in the device's sshd_config and install your key: {copy_id}",
        )
    problems: list[str] = []
    tried: list[str] = []
    for description, key in _candidates(device, opts, passphrase.encode() if passphrase else None, problems):
        try:
            rest = transport.auth_publickey(opts.user, key)
        except paramiko.AuthenticationException:
            tried.append(description)
            continue
        except paramiko.SSHException as exc:
            tried.append(f"{description} ({exc})")
            continue
        if not rest:
            return
        raise AuthRefused(f"{device}: {where} wants a second factor after the key ({', '.join(rest)}).",
                          hint="edgetk cannot answer it; allow key-only login for this user on the device.")
    raise _refused(device, opts, where, offered, tried, problems, copy_id)


def _refused(device: str, opts: SshOptions, where: str, offered: list[str], tried: list[str],
             problems: list[str], copy_id: str) -> AuthRefused:
    """Why no key got in: an encrypted or undecryptable key, no key at all, or every key refused."""
    for problem in problems:
        kind, _, path = problem.partition(":")
        if kind == "encrypted":
            return AuthRefused(
                f"{device}: the private key {home_relative(path)} for {where} is encrypted and no "
                "passphrase was given.",
                hint="Set $EDGETK_SSH_PASSPHRASE, or load the key into ssh-agent (ssh-add KEY), and retry.",
            )
        if kind == "undecryptable":
            return AuthRefused(
                f"{device}: cannot decrypt the private key {home_relative(path)} (wrong passphrase?).",
                hint="Check $EDGETK_SSH_PASSPHRASE, or load the key into ssh-agent (ssh-add KEY) and retry.",
            )
    if not tried:
        agent = ("no agent" if not opts.identity_agent else f"no key in the agent at "
                 f"{home_relative(opts.identity_agent)}" + (" matching an IdentityFile (IdentitiesOnly yes)"
                                                            if opts.identities_only else ""))
        return AuthRefused(
            f"{device}: no key to offer {where}: no IdentityFile, no ~/.ssh/id_* and {agent}.",
            hint="Make a key (ssh-keygen -t ed25519) and install it on the device: " + copy_id,
        )
    shown = "; ".join(tried[:5]) + (f"; and {len(tried) - 5} more" if len(tried) > 5 else "")
    return AuthRefused(
        f"{device}: {where} refused every key tried ({shown}); it offers: {', '.join(offered)}.",
        hint=f"Install one of them on the device: {copy_id} (or set IdentityFile for this host in "
        "~/.ssh/config).",
    )
