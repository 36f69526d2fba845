"""First boot: put the user's public key on a device that only takes a password yet (``edgetk devices add-key``).

For each device: log in with the password (paramiko; keyboard-interactive is answered with it too), with the
host key checked exactly as every other connection checks it (:class:`~toolkit.devices.ssh.SshConnection`:
an unknown key is refused unless ``trust_new_host`` and then recorded, a changed key is always refused); append
the key to ``~/.ssh/authorized_keys`` with a POSIX ``sh`` script that needs nothing beyond busybox (``mkdir``,
``chmod``, ``grep -F``, ``tail -c``; no ``ssh-copy-id``, no bash, no Python: a fresh board may have none), and
for root on a board with ``/etc/dropbear/`` (OpenWrt's Dropbear reads root's keys there) to
``/etc/dropbear/authorized_keys`` as well; then log in again with keys only to prove that it works.

The password: given by the caller (read once from a terminal, a file or an environment variable the user names:
``toolkit.api.add_key``), kept in memory for the run, never logged, stored, or put into a message.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import paramiko

from toolkit.devices.fleet import DeviceOutcome, run_fleet
from toolkit.devices.spec import DeviceSpec
from toolkit.devices.ssh import SshConnection
from toolkit.devices.ssh_auth import home_relative
from toolkit.devices.ssh_config import SshOptions, resolve
from toolkit.errors import AuthRefused, DeviceError, HostKeyRefused, UsageError
from toolkit.model.answers import AddKeyAnswer, KeyInstall

KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
             "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
DEFAULT_PUBLIC = ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub")

# $1: the key line, $2: its base64 blob (a key already there, whatever its comment or options, is not added
# twice). A file whose last line has no newline gets one first, so the key never joins another line.
INSTALL_SCRIPT = r"""umask 077
cd || exit 1
add() {
  if [ -f "$1" ] && grep -qF -e "$BLOB" "$1"; then echo "present $1"; return 0; fi
  if [ -s "$1" ]; then last=$(tail -c 1 "$1" 2>/dev/null) || last=x; [ -z "$last" ] || echo >> "$1" || return 1; fi
  printf '%s\n' "$KEY" >> "$1" && chmod 600 "$1" && echo "added $1"
}
KEY=$1
BLOB=$2
mkdir -p .ssh && chmod 700 .ssh && add .ssh/authorized_keys || exit 1
if [ "$(id -u)" = 0 ] && [ -d /etc/dropbear ]; then add /etc/dropbear/authorized_keys || exit 1; fi
"""


@dataclass(frozen=True)
class PublicKey:
    """The key to install: its one-line OpenSSH form, the file it came from, the private key beside it."""

    line: str
    path: Path
    private: Path | None

    @property
    def blob(self) -> str:
        return self.line.split()[1]

    @property
    def fingerprint(self) -> str:
        import hashlib

        digest = base64.b64encode(hashlib.sha256(base64.b64decode(self.blob)).digest()).decode().rstrip("=")
        return f"SHA256:{digest}"


def read_public_key(path: Path) -> PublicKey:
    """A ``.pub`` file (or the private key next to one) -> PublicKey; anything else is refused by name."""
    path = Path(os.path.expanduser(str(path)))
    if path.suffix != ".pub" and Path(f"{path}.pub").is_file():
        path = Path(f"{path}.pub")
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Cannot read the public key {path} ({getattr(exc, 'strerror', None) or exc}).",
                         hint="Pass --key ~/.ssh/id_ed25519.pub (make one with: ssh-keygen -t ed25519).") from None
    parts = text.split()
    valid = len(text.splitlines()) == 1 and len(parts) >= 2 and parts[0] in KEY_TYPES
    try:
        valid = valid and bool(base64.b64decode(parts[1], validate=True))
    except (binascii.Error, ValueError):
        valid = False
    if not valid or any(ord(c) < 32 for c in text):
        raise UsageError(f"{path} is not an OpenSSH public key (one line: TYPE BASE64 [COMMENT]).",
                         hint="Pass the .pub file of your key, e.g. --key ~/.ssh/id_ed25519.pub.")
    private = path.with_suffix("") if path.suffix == ".pub" and path.with_suffix("").is_file() else None
    return PublicKey(" ".join(parts), path, private)


def default_public_key(spec: DeviceSpec) -> PublicKey:
    """The key ssh would offer this device first (its IdentityFile), else ~/.ssh/id_{ed25519,ecdsa,rsa}.pub."""
    candidates: list[Path] = []
    if spec.host is not None:
        opts = resolve(spec.host, user=spec.user, port=spec.port, identity_file=spec.identity_file)
        candidates += [Path(f"{p}.pub") for p in opts.identity_files]
    candidates += [Path.home() / ".ssh" / name for name in DEFAULT_PUBLIC]
    for path in candidates:
        if path.is_file():
            return read_public_key(path)
    raise UsageError("No public key to install: no IdentityFile with a .pub beside it, no ~/.ssh/id_*.pub.",
                     hint="Make one with `ssh-keygen -t ed25519`, or pass --key FILE.pub.")


def read_password(path: str | os.PathLike[str] | None, env: str | None, ask: Callable[[], str] | None) -> str:
    """The device password from a file's first line, an environment variable, or a prompt; never echoed."""
    where = "no password source"
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"Cannot read the password file {path} ({getattr(exc, 'strerror', None) or exc}).") \
                from None
        password, where = (text[0] if text else ""), f"the password file {path}"
    elif env:
        if env not in os.environ:
            raise UsageError(f"The environment variable {env} (--password-env) is not set.",
                             hint=f"Set it first, e.g. read -rs {env} && export {env}.")
        password, where = os.environ[env], f"the environment variable {env}"
    elif ask is not None:
        password, where = ask(), "the prompt"
    else:
        raise UsageError(
            "add-key needs the devices' login password, and there is no terminal to ask it on.",
            hint="Name where to read it: --password-file FILE (its first line) or --password-env VAR.")
    if not password:
        raise UsageError(f"The password from {where} is empty.")
    return password


class _PasswordLogin(SshConnection):
    """An SSH connection that logs in with a password (host keys checked as always); for add-key only."""

    def __init__(self, spec: DeviceSpec, *, password: str, **kwargs: Any) -> None:  # Any: SshConnection's
        super().__init__(spec, **kwargs)
        self.__password = password  # never logged, never in a message

    def _authenticate(self, transport: paramiko.Transport, opts: SshOptions, timeout: float) -> None:
        transport.auth_timeout = timeout
        where = f"{opts.user}@{opts.hostname}" + ("" if opts.port == 22 else f":{opts.port}")
        # the device named once: its name, then the login only where the name does not already say it
        who = f"{self.name}: " + ("" if where == self.name else f"{where} ")
        try:
            transport.auth_password(opts.user, self.__password, fallback=True)
        except paramiko.BadAuthenticationType as exc:
            raise AuthRefused(
                f"{who}does not take a password (it offers: {', '.join(exc.allowed_types)}).",
                hint="Put the key on it another way (its console, the image), or allow PasswordAuthentication "
                "for the first login.") from None
        except paramiko.AuthenticationException:
            raise AuthRefused(f"{who}refused the password.",
                              hint="Check the password and the user name (user@host), then re-run.") from None


def _install(conn: SshConnection, spec: DeviceSpec, key: PublicKey) -> list[list[str]]:
    """Run the install script over ``conn``: [[added|present, file], ...]."""
    done = conn.run(["sh", "-c", INSTALL_SCRIPT, "sh", key.line, key.blob], timeout=60)
    if done.returncode != 0:
        raise DeviceError(f"{spec.name}: could not write ~/.ssh/authorized_keys "
                          f"({done.stderr.strip()[-200:] or f'exit {done.returncode}'}).",
                          hint="Check the free disk and that the home directory is writable by that user.")
    return [line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("added ", "present "))]


def _result(key: PublicKey, results: list[list[str]], *, key_login: bool, password_used: bool) -> KeyInstall:
    return KeyInstall(key=key.fingerprint, key_file=home_relative(key.path),
                      added=tuple(f for what, f in results if what == "added"),
                      present=tuple(f for what, f in results if what == "present"), key_login=key_login,
                      password_used=password_used)


def _keyed(spec: DeviceSpec, key: PublicKey) -> DeviceSpec:
    return replace(spec, identity_file=str(key.private)) if key.private else spec


def by_key(spec: DeviceSpec, key: PublicKey, *, known_hosts: str | None) -> KeyInstall | None:
    """When a key login already works (a re-run, a board imaged with the key), the install script runs over it
    and no password is needed; None when it does not (refused, or a host key not known yet: the password
    login decides then, with its own messages)."""
    try:
        with SshConnection(_keyed(spec, key), known_hosts=known_hosts, proxy_jump=spec.proxy_jump) as conn:
            return _result(key, _install(conn, spec, key), key_login=True, password_used=False)
    except (AuthRefused, HostKeyRefused):
        return None


def add_key(spec: DeviceSpec, key: PublicKey, password: str, *, trust_new_host: bool,
            known_hosts: str | None) -> KeyInstall:
    """Install ``key`` on one device over a password login, then prove a key login works."""
    if spec.is_local:
        raise UsageError("add-key installs a key on an SSH device; `local` needs none.")
    with _PasswordLogin(spec, password=password, trust_new_host=trust_new_host, known_hosts=known_hosts,
                        proxy_jump=spec.proxy_jump) as conn:
        results = _install(conn, spec, key)
    try:
        with SshConnection(_keyed(spec, key), known_hosts=known_hosts, proxy_jump=spec.proxy_jump) as check:
            proof = check.run(["sh", "-c", "exit 0"], timeout=60)
    except AuthRefused as exc:
        raise DeviceError(
            f"{spec.name}: the key is in ~/.ssh/authorized_keys, but a key login still fails "
            f"({exc.message.removeprefix(f'{spec.name}: ')})",
            hint="The device's sshd may refuse keys in a group- or world-writable home or ~/.ssh (StrictModes), "
            "or read keys from another file (AuthorizedKeysFile).") from None
    return _result(key, results, key_login=proof.returncode == 0, password_used=True)


def add_keys(specs: Sequence[DeviceSpec], *, public_key: str | os.PathLike[str] | None,
             password_file: str | os.PathLike[str] | None, password_env: str | None,
             ask: Callable[[], str] | None, trust_new_host: bool, known_hosts: str | os.PathLike[str] | None,
             parallel: int) -> tuple[DeviceOutcome[AddKeyAnswer], ...]:
    """``add_key`` on every device (an :class:`AddKeyAnswer` each): the key and the password are read once, before
    any device is contacted, so a missing key or password source fails at once (exit 2)."""
    key = read_public_key(Path(public_key)) if public_key else default_public_key(specs[0]) if specs else None
    # a password file or variable is read at once (a bad one fails before any device is contacted); the prompt
    # only when a device needs it: one whose key login already works is done without a password
    given = [read_password(password_file, password_env, None)] if password_file is not None or password_env else []
    asked = threading.Lock()
    known = str(known_hosts) if known_hosts else None

    def password() -> str:
        with asked:
            if not given:
                given.append(read_password(None, None, ask))
        return given[0]

    def one(spec: DeviceSpec) -> AddKeyAnswer:
        assert key is not None
        if spec.is_local:
            raise UsageError("add-key installs a key on an SSH device; `local` needs none.")
        done = by_key(spec, key, known_hosts=known or spec.known_hosts)
        if done is None:
            done = add_key(spec, key, password(), trust_new_host=trust_new_host, known_hosts=known or spec.known_hosts)
        return AddKeyAnswer(add_key=done)

    return run_fleet(specs, one, parallel=parallel).outcomes
