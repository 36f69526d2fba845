"""SSH authentication with public keys only (files, certificates, an agent), in ``ssh``'s order; a refusal says
what the server offered and what was tried, and how to install a key.

paramiko ships no type information: its keys and transports are ``Any`` here.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
from pathlib import Path

import paramiko

from toolkit.devices.ssh_config import SshOptions
from toolkit.devices.ssh_hostkeys import fingerprint, home_relative
from toolkit.errors import AuthRefused

log = logging.getLogger(__name__)
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_ecdsa_sk", "id_ed25519_sk", "id_rsa", "id_dsa")


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
        agent = paramiko.agent.AgentSSH()
        agent._connect(sock)
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
