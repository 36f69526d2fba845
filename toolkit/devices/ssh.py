"""An SSH device through paramiko (the only module that imports it).

Where to connect, and how, comes from the user's OpenSSH configuration as ``ssh`` reads it
(:mod:`toolkit.devices.ssh_config`: Include, ProxyJump, ProxyCommand, IdentityFile/IdentitiesOnly/
IdentityAgent/CertificateFile, UserKnownHostsFile/GlobalKnownHostsFile/HostKeyAlias/HashKnownHosts,
ConnectTimeout, ServerAliveInterval/CountMax); an option it cannot follow is refused by name.

Security: the host key is checked against the known_hosts files (the device's ``known_hosts``/``--known-hosts``,
else UserKnownHostsFile and GlobalKnownHostsFile). An unknown host is refused unless ``trust_new_host`` (or
``StrictHostKeyChecking accept-new``; ``no`` is taken as ``accept-new``: edgetk never connects to a host whose
key CHANGED), in which case its key is appended to the first user file (hashed with ``HashKnownHosts yes``).
Authentication is public keys only (files, certificates, an agent); a refusal says what the server offered and
what was tried, and how to install a key.

Reliability (findings.md sections 4-5): a dead link is noticed by TCP (``TCP_USER_TIMEOUT`` on a socket we
create, TCP keepalives). A device that stops answering while its kernel still ACKs TCP (a frozen userland, a
hung SD card, ``kill -STOP`` of its sshd) is noticed by a watchdog thread per connection: every byte from the
server refreshes a clock; after ``ServerAliveInterval`` seconds of silence (default 3) a keepalive that demands
a reply is sent, and after ``ServerAliveCountMax`` intervals (default 4) of silence the connection is cut and
every call on it raises :class:`~toolkit.errors.DeviceStopped`, whatever step it was in (connect, a command,
an upload), so a frozen device fails within about 15 s and never hangs the tool. Which one it was is told by
the kernel: a frozen device's TCP stack still acknowledges (``tcp_info.tcpi_last_ack_recv``), a dead link's
does not (:class:`~toolkit.errors.LinkDropped`); ``TCP_USER_TIMEOUT`` is set past the watchdog's limit so that
the watchdog speaks first. Commands have their own
deadline on top (:class:`~toolkit.errors.DeviceTimeout`).

Shells that talk: a login shell that prints on start-up (a ``~/.bashrc`` echo) prefixes every command's stdout
and breaks the SFTP stream. Each command prints a marker first and whatever precedes it is dropped (and
reported once, naming the device and the fix); when SFTP cannot start, files go over exec channels
(``cat``, or one framed stream per push: ``toolkit.delivery.deploy_stream``), which that noise cannot corrupt.

Dropbear without an sftp-server (findings.md section 6): whether SFTP starts is asked once per device and
remembered (:mod:`toolkit.devices.host_facts`); a connection whose SFTP start failed is closed at once and never
used again, and a session channel that is refused, or whose connection closes while it opens, is tried once
more on a fresh connection (the command has not started then) before it counts as a failure.

Throughput: SFTP is opened with a large window so a 50 MB push is not window-bound; writes are pipelined, and
each write request carries 64 KiB instead of paramiko's 32 KiB (``SFTP_WRITE_SIZE``). AES-GCM is offered first
when the server has it, as OpenSSH's own client does (about 15% less time for a 50 MB upload here).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import select
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import paramiko

from toolkit.devices.connection import Progress, quote_argv
from toolkit.devices.host_facts import host_id, remember_sftp, sftp_known
from toolkit.devices.spec import DeviceSpec, parse_spec
from toolkit.devices.ssh_config import SshOptions, resolve
from toolkit.devices.ssh_watch import _Watchdog, _WatchedSocket
from toolkit.errors import (
    AuthRefused,
    DeviceError,
    DeviceStopped,
    DeviceTimeout,
    DeviceUnreachable,
    HostKeyRefused,
    LinkDropped,
)
from toolkit.model.device_records import CommandResult

log = logging.getLogger(__name__)
if not os.environ.get("EDGETK_DEBUG"):
    # paramiko logs its own tracebacks (a banner timeout, a dead link) at ERROR; edgetk says what happened once,
    # in plain words (--debug shows paramiko's log too)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)

USER_TIMEOUT_MS = 15_000  # unacknowledged data older than this kills the TCP connection
KEEPALIVE_S = 5
DEFAULT_CONNECT_TIMEOUT_S = 15.0
ALIVE_INTERVAL_S = 3.0  # ServerAliveInterval when the configuration sets none
ALIVE_COUNT_MAX = 4  # ServerAliveCountMax when the configuration sets none
SFTP_WINDOW = 1 << 27
SFTP_MAX_PACKET = 1 << 15
SFTP_WRITE_SIZE = 1 << 16  # bytes per SFTP write request (paramiko: 32 KiB; OpenSSH's server takes 256 KiB)
UPLOAD_STALL_S = 60.0  # an upload whose data the device stops taking (a hung disk, sshd still alive) fails then
OUT_MARK = "__edgetk_out_8c1e__"  # printed before each command's own output: what precedes it is shell noise
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_ecdsa_sk", "id_ed25519_sk", "id_rsa", "id_dsa")


def read_blocks(path: Path, offset: int = 0, size: int = 1 << 18) -> Iterator[bytes]:
    """The bytes of ``path`` from ``offset`` on, in blocks of ``size``."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        while block := handle.read(size):
            yield block


class _Transport(paramiko.Transport):
    """paramiko's transport with the AES-GCM ciphers first (see the module docstring)."""

    _preferred_ciphers = tuple(
        sorted(paramiko.Transport._preferred_ciphers, key=lambda c: 0 if c.startswith("aes128-gcm") else
               1 if c.startswith("aes256-gcm") else 2)
    )


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint, what ``ssh-keygen -lf`` prints."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def default_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


def _home_relative(path: str | os.PathLike[str]) -> str:
    text = str(path)
    home = str(Path.home())
    return "~" + text[len(home):] if text.startswith(home + os.sep) else text


class SshConnection:
    """A lazily opened SSH connection (commands + SFTP) to one device."""

    def __init__(
        self,
        spec: DeviceSpec,
        *,
        trust_new_host: bool = False,
        known_hosts: str | os.PathLike[str] | None = None,
        connect_timeout: float | None = None,
        passphrase: str | None = None,
        proxy_jump: str | None = None,
    ) -> None:
        if spec.host is None:
            raise ValueError("SshConnection needs a host")
        self.spec = spec
        self.name = spec.name
        self.trust_new_host = trust_new_host
        self.known_hosts = Path(os.path.expanduser(str(known_hosts))) if known_hosts else None
        self.connect_timeout = connect_timeout
        # the key passphrase: given here or in $EDGETK_SSH_PASSPHRASE; never logged, never part of a message
        self._passphrase = passphrase if passphrase is not None else os.environ.get("EDGETK_SSH_PASSPHRASE")
        self._proxy_jump = proxy_jump
        self._transport_obj: paramiko.Transport | None = None
        self._stream: _WatchedSocket | None = None
        self._watchdog: _Watchdog | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_broken: str | None = None  # why SFTP cannot be used: files then go over exec channels
        self._jump: SshConnection | None = None
        self._lost: LinkDropped | None = None  # once the link is gone: no silent reconnect after that
        self._stopped: str | None = None  # set by the watchdog: the device stopped answering
        self._silent: str | None = None  # set by the watchdog: silence and no TCP acknowledgements (a dead link)
        self._noise_reported = False
        self.options: SshOptions | None = None
        self.shell_noise: str | None = None  # what the login shell printed before a command, if anything
        self.connect_seconds: float | None = None

    # ----------------------------------------------------------------------------------------- connecting

    def _resolve(self) -> SshOptions:
        assert self.spec.host is not None
        if self.options is None:
            self.options = resolve(self.spec.host, user=self.spec.user, port=self.spec.port,
                                   identity_file=self.spec.identity_file, proxy_jump=self._proxy_jump)
        return self.options

    def _timeout(self, opts: SshOptions) -> float:
        return self.connect_timeout or opts.connect_timeout or DEFAULT_CONNECT_TIMEOUT_S

    def _socket(self, hostname: str, port: int, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection((hostname, port), timeout=timeout)
        except socket.gaierror:
            files = ", ".join(_home_relative(f) for f in (self.options.config_files if self.options else ())[:3])
            raise DeviceUnreachable(
                f"{self.name}: cannot resolve the host name {hostname!r}.",
                hint="Check the spelling and your DNS" + (f", or the Host entries in {files}." if files else
                                                          ", or add a Host alias for it to ~/.ssh/config."),
            ) from None
        except TimeoutError:
            raise DeviceUnreachable(
                f"{self.name}: no answer from {hostname}:{port} within {timeout:.0f} s.",
                hint="Is the device powered on and on the network?",
            ) from None
        except ConnectionRefusedError:
            raise DeviceUnreachable(
                f"{self.name}: {hostname}:{port} refused the connection.",
                hint="Is sshd running on the device, on that port?",
            ) from None
        except OSError as exc:
            raise DeviceUnreachable(f"{self.name}: cannot connect to {hostname}:{port} ({exc.strerror or exc}).") \
                from None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        opts = self._resolve()
        watchdog_s = (opts.server_alive_interval or ALIVE_INTERVAL_S) * (opts.server_alive_count_max or ALIVE_COUNT_MAX)
        for opt, value in (
            # the watchdog speaks first, so that a frozen device is told apart from a dead link (see _Watchdog)
            ("TCP_USER_TIMEOUT", max(USER_TIMEOUT_MS, int((watchdog_s + 5) * 1000))),
            ("TCP_KEEPIDLE", KEEPALIVE_S),
            ("TCP_KEEPINTVL", KEEPALIVE_S),
            ("TCP_KEEPCNT", 3),
            ("TCP_NODELAY", 1),
        ):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
        return sock

    def _open_stream(self, opts: SshOptions, timeout: float) -> Any:
        """A byte stream to the device's sshd: through the jump host(s), a ProxyCommand, or straight."""
        if opts.proxy_jump:
            chain = [j.strip() for j in opts.proxy_jump.split(",") if j.strip()]
            self._jump = SshConnection(
                parse_spec(chain[-1]), trust_new_host=self.trust_new_host, known_hosts=self.known_hosts,
                connect_timeout=self.connect_timeout, passphrase=self._passphrase, proxy_jump=",".join(chain[:-1]),
            )
            transport = self._jump._transport()
            try:
                return transport.open_channel("direct-tcpip", (opts.hostname, opts.port), ("127.0.0.1", 0),
                                              timeout=timeout)
            except (paramiko.SSHException, OSError) as exc:
                raise DeviceUnreachable(
                    f"{self.name}: the jump host {chain[-1]} could not reach {opts.hostname}:{opts.port} ({exc})."
                ) from None
        if opts.proxy_command:
            try:
                return paramiko.ProxyCommand(opts.proxy_command)
            except Exception as exc:
                raise DeviceUnreachable(f"{self.name}: the ProxyCommand {opts.proxy_command!r} did not start "
                                        f"({exc}).", hint="Check it in your SSH configuration.") from None
        return self._socket(opts.hostname, opts.port, timeout)

    def _connect(self) -> paramiko.Transport:
        if self._transport_obj is not None:
            return self._transport_obj
        if self._lost is not None:
            raise self._lost  # after a drop, a reconnect would wait on a dead link again; fail at once
        started = time.perf_counter()
        opts = self._resolve()
        timeout = self._timeout(opts)
        try:
            stream = _WatchedSocket(self._open_stream(opts, timeout))
        except DeviceError:
            self.close()
            raise
        started_recv = stream.last_recv
        transport = _Transport(stream)
        transport.banner_timeout = timeout
        # the watchdog covers the handshake too: a device that freezes while we log in is noticed as well
        self._watchdog = _Watchdog(self, transport, stream, opts.server_alive_interval or ALIVE_INTERVAL_S,
                                   opts.server_alive_count_max or ALIVE_COUNT_MAX)
        try:
            self._prefer_known_key_types(transport, opts)
            transport.start_client(timeout=timeout)
            self._watchdog.start()
            self._check_host_key(transport, opts)
            self._authenticate(transport, opts, timeout)
        except DeviceError:
            transport.close()
            self.close()
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            transport.close()
            if self._stopped:
                raise self._dropped("during the login") from None
            self.close()
            if stream.last_recv == started_recv:  # not one byte back: a frozen sshd, or no SSH server there
                self._lost = DeviceStopped(
                    f"{self.name}: the device stopped answering: {opts.hostname}:{opts.port} took the TCP "
                    f"connection but sent no SSH greeting within {timeout:.0f} s.",
                    hint="It may be frozen or overloaded (a hung SD card, out of memory), or that port is not an "
                    "SSH server. Re-run once it answers.",
                )
                raise self._lost from None
            raise DeviceUnreachable(
                f"{self.name}: SSH to {opts.hostname}:{opts.port} failed ({type(exc).__name__}: {exc}).",
                hint="Is it an SSH server? Check the port, the ProxyCommand if any, and the device's sshd logs.",
            ) from None
        transport.set_keepalive(KEEPALIVE_S)
        self._transport_obj = transport
        self._stream = stream
        self.connect_seconds = time.perf_counter() - started
        return transport

    # ----------------------------------------------------------------------------------------- host keys

    def _known_files(self, opts: SshOptions) -> tuple[list[Path], list[Path]]:
        """(files to read, in order; the file a trusted key is written to first)."""
        if self.known_hosts is not None:
            return [self.known_hosts], [self.known_hosts]
        return [*opts.user_known_hosts, *opts.global_known_hosts], list(opts.user_known_hosts)

    def _host_keys(self, opts: SshOptions) -> paramiko.HostKeys:
        keys = paramiko.HostKeys()
        for path in self._known_files(opts)[0]:
            if path.is_file():
                try:
                    keys.load(str(path))
                except (OSError, paramiko.SSHException) as exc:
                    raise HostKeyRefused(f"{self.name}: cannot read {path} ({exc}).") from None
        return keys

    def _prefer_known_key_types(self, transport: paramiko.Transport, opts: SshOptions) -> None:
        """Ask first for the key type known_hosts holds for this host (as ssh does), so that a host known by
        its RSA key is not refused because it also has an ed25519 one."""
        known = self._host_keys(opts).lookup(opts.host_key_name)
        if known:
            options = transport.get_security_options()
            first = [k for k in known.keys() if k in options.key_types]
            options.key_types = first + [k for k in options.key_types if k not in first]

    def _check_host_key(self, transport: paramiko.Transport, opts: SshOptions) -> None:
        key = transport.get_remote_server_key()
        name = opts.host_key_name
        read, write = self._known_files(opts)
        known = self._host_keys(opts).lookup(name)
        where = ", ".join(_home_relative(p) for p in read[:2]) or "no known_hosts file"
        if known and key.get_name() in known and known[key.get_name()] == key:
            return
        if known:
            expected = next(iter(known.values()))
            raise HostKeyRefused(
                f"{self.name}: the host key of {name} CHANGED: {where} has {fingerprint(expected)}, the host now "
                f"offers {fingerprint(key)}. Refusing to connect.",
                hint="If the device was re-imaged, check the new fingerprint on its console, then remove the old "
                f"entry with: ssh-keygen -R '{name}' -f {write[0] if write else read[0]}. Otherwise someone may "
                "be intercepting the connection.",
            )
        if not (self.trust_new_host or opts.strict_host_key_checking == "accept-new"):
            raise HostKeyRefused(
                f"{self.name}: the host {name} is not in {where} (it offers the {key.get_name()} key "
                f"{fingerprint(key)}).",
                hint="Check that fingerprint on the device (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then "
                "re-run with --trust-new-host to record it.",
            )
        if not write:
            raise HostKeyRefused(f"{self.name}: the host {name} is unknown and UserKnownHostsFile is none: "
                                 "there is nowhere to record its key.", hint="Pass --known-hosts FILE.")
        entry = paramiko.HostKeys.hash_host(name) if opts.hash_known_hosts else name
        target = write[0]
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as handle:
            handle.write(f"{entry} {key.get_name()} {key.get_base64()}\n")

    # ----------------------------------------------------------------------------------------- authentication

    def _load_key(self, path: str, problems: list[str]) -> paramiko.PKey | None:
        """The private key at ``path`` without any certificate, or None (the reason goes to ``problems``)."""
        password = self._passphrase.encode() if self._passphrase else None
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

    def _with_certificate(self, path: str, certificate: str) -> paramiko.PKey | None:
        password = self._passphrase.encode() if self._passphrase else None
        try:
            key = paramiko.PKey.from_path(path, password)
            key.load_certificate(certificate)
        except (ValueError, TypeError, paramiko.SSHException, OSError):
            return None  # a certificate for another key, or an unreadable one
        return key

    def _agent_keys(self, opts: SshOptions) -> list[paramiko.AgentKey]:
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
            log.warning("%s: the SSH agent at %s did not answer (%s)", self.name, opts.identity_agent, exc)
            sock.close()
            return []

    def _candidates(self, opts: SshOptions, problems: list[str]) -> list[tuple[str, paramiko.PKey]]:
        """(description, key) in ssh's order: identity files (with their certificates), then agent keys."""
        home = Path.home()
        files = list(opts.identity_files)
        if opts.default_identities:
            files += [str(home / ".ssh" / n) for n in DEFAULT_KEYS if (home / ".ssh" / n).is_file()]
        certificates = [*opts.certificate_files]
        file_keys: list[tuple[str, paramiko.PKey]] = []
        public_blobs: set[bytes] = set()
        for path in files:
            pub = Path(path + ".pub")
            if pub.is_file():
                try:
                    public_blobs.add(base64.b64decode(pub.read_text().split()[1]))
                except (IndexError, ValueError, OSError):
                    pass
            key = self._load_key(path, problems)
            if key is None:
                continue
            public_blobs.add(key.asbytes())
            cert = Path(path + "-cert.pub")
            for candidate in dict.fromkeys([*certificates, *([str(cert)] if cert.is_file() else [])]):
                with_cert = self._with_certificate(path, candidate)
                if with_cert is not None:
                    file_keys.append((f"certificate {_home_relative(candidate)}", with_cert))
            file_keys.append((f"key {_home_relative(path)}", key))
        agent = [(f"agent key {k.comment or fingerprint(k)}", k) for k in self._agent_keys(opts)
                 if not opts.identities_only or k.asbytes() in public_blobs
                 or any(k.asbytes() == fk.asbytes() for _, fk in file_keys)]
        if opts.identities_only and not files:
            agent = []
        # the agent holds the private half of an encrypted identity file: prefer it over failing on the file
        return file_keys + agent

    def _authenticate(self, transport: paramiko.Transport, opts: SshOptions, timeout: float) -> None:
        transport.auth_timeout = timeout
        where = f"{opts.user}@{opts.hostname}" + ("" if opts.port == 22 else f":{opts.port}")
        copy_id = f"ssh-copy-id {'-p ' + str(opts.port) + ' ' if opts.port != 22 else ''}" \
                  f"-i {_home_relative(opts.identity_files[0]) if opts.identity_files else '~/.ssh/id_ed25519'}.pub " \
                  f"{opts.user}@{opts.hostname}"
        copy_id = f"edgetk devices add-key --device {self.name} (or {copy_id})"  # a password login is enough
        try:
            transport.auth_none(opts.user)
            return  # the server lets us in without credentials
        except paramiko.BadAuthenticationType as exc:
            offered = list(exc.allowed_types)
        except paramiko.AuthenticationException:
            offered = ["publickey"]
        if "publickey" not in offered:
            raise AuthRefused(
                f"{self.name}: {where} does not accept keys (it offers: {', '.join(offered) or 'nothing'}); "
                "edgetk logs in with keys only.",
                hint=f"Enable PubkeyAuthentication in the device's sshd_config and install your key: {copy_id}",
            )
        problems: list[str] = []
        tried: list[str] = []
        for description, key in self._candidates(opts, problems):
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
            raise AuthRefused(f"{self.name}: {where} wants a second factor after the key ({', '.join(rest)}).",
                              hint="edgetk cannot answer it; allow key-only login for this user on the device.")
        for problem in problems:
            kind, _, path = problem.partition(":")
            if kind == "encrypted":
                raise AuthRefused(
                    f"{self.name}: the private key {_home_relative(path)} for {where} is encrypted and no "
                    "passphrase was given.",
                    hint="Set $EDGETK_SSH_PASSPHRASE, or load the key into ssh-agent (ssh-add KEY), and retry.",
                )
            if kind == "undecryptable":
                raise AuthRefused(
                    f"{self.name}: cannot decrypt the private key {_home_relative(path)} (wrong passphrase?).",
                    hint="Check $EDGETK_SSH_PASSPHRASE, or load the key into ssh-agent (ssh-add KEY) and retry.",
                )
        if not tried:
            agent = ("no agent" if not opts.identity_agent else f"no key in the agent at "
                     f"{_home_relative(opts.identity_agent)}" + (" matching an IdentityFile (IdentitiesOnly yes)"
                                                                   if opts.identities_only else ""))
            raise AuthRefused(
                f"{self.name}: no key to offer {where}: no IdentityFile, no ~/.ssh/id_* and {agent}.",
                hint="Make a key (ssh-keygen -t ed25519) and install it on the device: " + copy_id,
            )
        shown = "; ".join(tried[:5]) + (f"; and {len(tried) - 5} more" if len(tried) > 5 else "")
        raise AuthRefused(
            f"{self.name}: {where} refused every key tried ({shown}); it offers: {', '.join(offered)}.",
            hint=f"Install one of them on the device: {copy_id} (or set IdentityFile for this host in "
            "~/.ssh/config).",
        )

    # ----------------------------------------------------------------------------------------- link state

    def _transport(self) -> paramiko.Transport:
        transport = self._connect()
        if not transport.is_active():
            raise self._dropped("the connection is closed")
        return transport

    def _dropped(self, what: str) -> LinkDropped:
        """The link is gone (or the device stopped answering): close, and remember it for every later call."""
        stopped = self._stopped
        self.close()
        if self._lost is not None:
            return self._lost
        if stopped:
            self._lost = DeviceStopped(
                f"{self.name}: the device stopped answering ({stopped}).",
                hint="It may be frozen or overloaded (a hung SD card, out of memory). Nothing was switched: the "
                "current version is untouched. Re-run once it answers: files already sent are not sent again.",
            )
        else:
            self._lost = LinkDropped(
                f"{self.name}: the link to the device dropped ({self._silent or what}).",
                hint="Check the network and re-run: files already sent are not sent again.",
            )
        return self._lost

    def _strip_noise(self, out: bytes) -> bytes:
        mark = OUT_MARK.encode()
        at = out.find(mark)
        if at < 0:
            return out
        if at > 0:
            self._report_noise(out[:at])
        return out[at + len(mark):]

    def _report_noise(self, noise: bytes) -> None:
        text = noise.decode("utf-8", "replace").strip()
        self.shell_noise = text
        if not self._noise_reported:
            self._noise_reported = True
            log.warning("%s", self.noise_message(text))

    def noise_message(self, text: str | None = None) -> str:
        """What to tell the user about a login shell that prints on start-up."""
        opts = self.options
        who = f"{opts.user}@{opts.hostname}" if opts else self.name
        shown = (text if text is not None else self.shell_noise or "").splitlines()
        sample = f" ({shown[0][:60]!r}...)" if shown else ""
        return (f"{self.name}: the login shell on {who} prints text on start-up{sample} (~/.bashrc or "
                "~/.profile?): guard it with `[ -z \"$PS1\" ] && return` at the top of ~/.bashrc, or print to stderr")

    # ----------------------------------------------------------------------------------------- commands

    def _open_command(self, command: str, what: str) -> tuple[paramiko.Transport, paramiko.Channel]:
        """A session channel running ``command``. A channel the device refuses, or a connection that closes while
        the channel opens, is tried once more on a fresh connection before it counts as a failure: the command
        has not started then, and Dropbear sometimes ends a connection just when a channel opens (findings.md 6)."""
        for attempt in (1, 2):
            transport = self._transport()
            try:
                chan = transport.open_session(window_size=SFTP_WINDOW, max_packet_size=SFTP_MAX_PACKET,
                                              timeout=self._timeout(self._resolve()))
                chan.exec_command(f"printf %s {OUT_MARK}; {command}")
                return transport, chan
            except (paramiko.SSHException, EOFError, OSError) as exc:
                failure = f"{type(exc).__name__}: {exc}".rstrip(".")
                alive = transport.is_active()
                if self._stopped or self._silent:
                    raise self._dropped(f"opening a session for {what}: {failure}") from None
                log.debug("%s: opening a session for %s failed (%s, attempt %d)", self.name, what, failure, attempt)
                self.close()  # this connection only: the next attempt opens a fresh one
        if alive:
            raise DeviceError(f"{self.name}: the device refused a session for {what} on two connections ({failure}).",
                              hint="Its SSH server may limit sessions (MaxSessions, MaxStartups) or be out of memory.")
        raise self._dropped(f"the connection closed while opening a session for {what}, twice: {failure}")

    def _exec(self, command: str, *, timeout: float | None, what: str,
              stdin: Iterable[bytes] | Callable[[bytes], Iterable[bytes]] | None = None, total: int = 0,
              progress: Progress | None = None, reply_end: bytes = b"") -> tuple[int, bytes, bytes]:
        """Run ``command`` through the login shell (stdout after the marker); stream the blocks of ``stdin`` to it
        (``progress(sent, total)`` after each). A command that ends before taking all its input (it refused it)
        keeps its answer: the rest is not sent. A callable ``stdin`` is a conversation: it is called with the
        command's first answer (its stdout up to ``reply_end``, within ``timeout``) and gives the blocks to send
        then; it is not called when the command ends before answering."""
        transport, chan = self._open_command(command, what)
        out: list[bytes] = []
        err: list[bytes] = []
        if callable(stdin):
            if not self._collect(chan, transport, out, err, timeout, what, until=reply_end):
                return self._ended(chan, transport, out, err, what)
            stdin = stdin(self._strip_noise(b"".join(out)))
            timeout = None  # the files take what they take; a stalled device is caught per block below
        try:
            if stdin is not None:
                chan.settimeout(UPLOAD_STALL_S)  # sendall waits for window space at most this long
                sent = 0
                for block in stdin:
                    try:
                        chan.sendall(block)
                    except TimeoutError:
                        chan.close()
                        raise DeviceTimeout(
                            f"{self.name}: the device took no data for {UPLOAD_STALL_S:.0f} s ({what}).",
                            hint="Its disk may be hung or very slow (an SD card failing?); check `dmesg`.",
                        ) from None
                    except (paramiko.SSHException, OSError):
                        if transport.is_active() and (chan.closed or chan.eof_received or chan.exit_status_ready()):
                            break  # the command ended early: its answer says why
                        raise
                    sent += len(block)
                    if progress:
                        progress(sent, total)
            chan.shutdown_write()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            chan.close()
            raise self._dropped(f"{what}: {type(exc).__name__}: {exc}") from None
        self._collect(chan, transport, out, err, timeout, what)
        return self._ended(chan, transport, out, err, what)

    def _collect(self, chan: paramiko.Channel, transport: paramiko.Transport, out: list[bytes], err: list[bytes],
                 timeout: float | None, what: str, *, until: bytes = b"") -> bool:
        """Read the command's stdout and stderr into ``out``/``err`` until it ends (False), or, with ``until``,
        until its stdout holds ``until`` (True); ``timeout`` seconds at most."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                got = False
                while chan.recv_ready():
                    out.append(chan.recv(1 << 16))
                    got = True
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(1 << 16))
                    got = True
                if until and got and until in b"".join(out):
                    return True
                # sshd may send the exit status before the last output: done at EOF, not at the status
                if chan.exit_status_ready() and (chan.eof_received or chan.closed) and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    return False
                if deadline is not None and time.monotonic() > deadline:
                    chan.close()
                    raise DeviceTimeout(
                        f"{self.name}: {what} did not finish within {timeout:.0f} s.",
                        hint="Raise the timeout, or look at what hangs on the device.",
                    )
                if not transport.is_active():
                    chan.close()
                    raise self._dropped(f"no answer from the device during {what}")
                if not got and chan.eof_received:
                    chan.status_event.wait(0.05)  # the output is complete; its pipe stays readable, so no select
                elif not got:
                    select.select([chan], [], [], 0.05)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            chan.close()
            raise self._dropped(f"{what}: {type(exc).__name__}: {exc}") from None

    def _ended(self, chan: paramiko.Channel, transport: paramiko.Transport, out: list[bytes], err: list[bytes],
               what: str) -> tuple[int, bytes, bytes]:
        """The ended command's exit status and output (the channel closed)."""
        try:
            status = chan.recv_exit_status()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self._dropped(f"{what}: {type(exc).__name__}: {exc}") from None
        finally:
            chan.close()
        if status == -1 and not transport.is_active():
            raise self._dropped(f"the connection closed during {what}")
        return status, self._strip_noise(b"".join(out)), b"".join(err)

    def stream(self, argv: Sequence[str], blocks: Iterable[bytes] | Callable[[str], Iterable[bytes] | None], *,
               total: int, progress: Progress | None = None, timeout: float | None = None,
               reply_end: str = "") -> CommandResult:
        """Run ``argv`` with ``blocks`` as its standard input, on one channel (a push's framed stream of files).
        A callable ``blocks`` holds a conversation: it gets the command's first answer (its stdout up to
        ``reply_end``, within ``timeout``) and gives the blocks to send then (None: nothing, stdin is closed)."""
        stdin: Iterable[bytes] | Callable[[bytes], Iterable[bytes]] = blocks  # type: ignore[assignment]
        if callable(blocks):
            answer = blocks
            stdin = lambda head: answer(head.decode("utf-8", "replace")) or ()  # noqa: E731
        status, out, err = self._exec("exec " + quote_argv(argv), timeout=timeout, what="sending the files",
                                      stdin=stdin, total=total, progress=progress, reply_end=reply_end.encode())
        return CommandResult(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        status, out, err = self._exec("exec " + quote_argv(argv), timeout=timeout,
                                      what=os.path.basename(str(argv[0])))
        return CommandResult(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    # ----------------------------------------------------------------------------------------- files

    def _facts_key(self, transport: paramiko.Transport) -> str:
        opts = self._resolve()
        return host_id(opts.user, opts.hostname, opts.port, fingerprint(transport.get_remote_server_key()))

    def _sftp_client(self) -> paramiko.SFTPClient | None:
        """SFTP, or None when it cannot start (no sftp-server, as with Dropbear; a talking login shell corrupts
        its stream): files go over exec channels then. Whether it starts is asked once per device and remembered
        (:mod:`toolkit.devices.host_facts`); after a failed start this connection is dropped and the next call
        opens a fresh one, because Dropbear may end a connection whose SFTP request failed when the next channel
        opens (findings.md section 6)."""
        if self._sftp is None and self._sftp_broken is None:
            transport = self._transport()
            key = self._facts_key(transport)
            if sftp_known(key) is False:
                self._sftp_broken = "no SFTP server on the device (remembered)"
                return None
            try:
                sftp = paramiko.SFTPClient.from_transport(
                    transport, window_size=SFTP_WINDOW, max_packet_size=SFTP_MAX_PACKET
                )
                if sftp is None:
                    raise paramiko.SSHException("no sftp subsystem")
            except (paramiko.SFTPError, paramiko.SSHException, EOFError, OSError) as exc:
                if self._stopped or self._silent:
                    raise self._dropped(f"starting SFTP: {type(exc).__name__}: {exc}") from None
                self._sftp_broken = f"{type(exc).__name__}: {exc}"
                if transport.is_active():
                    remember_sftp(key, False)
                log.debug("%s: SFTP cannot start (%s); files go over exec channels", self.name, exc)
                self.close()  # never another channel on this connection: the next call opens a fresh one
                return None
            remember_sftp(key, True)
            sftp.get_channel().settimeout(UPLOAD_STALL_S)  # per request and per window wait: a stalled write
            self._sftp = sftp
        return self._sftp

    def sftp_available(self) -> bool:
        """Whether files go over SFTP on this device (asked once per device, see ``_sftp_client``)."""
        return self._sftp_client() is not None

    def put(self, local: Path, remote: str, *, progress: Progress | None = None, offset: int = 0) -> None:
        size = Path(local).stat().st_size
        sftp = self._sftp_client()
        if sftp is None:
            self._exec_put(Path(local), remote, size, progress=progress, offset=offset)
            return
        try:
            with open(local, "rb") as handle, sftp.file(remote, "r+b" if offset else "wb") as target:
                target.set_pipelined(True)
                target.MAX_REQUEST_SIZE = SFTP_WRITE_SIZE  # shadows paramiko's class constant
                target.chmod(0o644)
                if offset:
                    handle.seek(offset)
                    target.seek(offset)
                sent = 0
                while block := handle.read(1 << 18):
                    target.write(block)
                    sent += len(block)
                    if progress:
                        progress(sent, size - offset)
            attrs = sftp.stat(remote)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            transport = self._transport_obj
            if isinstance(exc, TimeoutError) and transport is not None and transport.is_active() and \
                    not self._stopped:
                self.close()  # the SFTP session is in an unknown state: the next call opens a fresh one
                raise DeviceTimeout(
                    f"{self.name}: the device took no data for {UPLOAD_STALL_S:.0f} s while writing {remote}, "
                    "although it still answers.",
                    hint="Its disk may be hung or very slow (an SD card failing?); check `dmesg` on the device.",
                ) from None
            if isinstance(exc, OSError) and transport is not None and transport.is_active() and not self._stopped:
                # the link is fine: the device refused the write (a full disk, permissions)
                raise DeviceError(f"{self.name}: writing {remote} failed ({exc.strerror or exc}).") from None
            raise self._dropped(f"{type(exc).__name__}: {exc}") from None
        if attrs.st_size != size:
            raise DeviceError(f"{self.name}: {remote} has {attrs.st_size} bytes after the upload, expected {size}.")

    def _exec_put(self, local: Path, remote: str, size: int, *, progress: Progress | None, offset: int) -> None:
        script = ('umask 022; if [ "$2" -gt 0 ]; then cat >> "$1"; else cat > "$1"; fi && chmod 644 "$1" && '
                  'wc -c < "$1"')
        status, out, err = self._exec(quote_argv(["sh", "-c", script, "sh", remote, str(offset)]), timeout=None,
                                      what=f"writing {remote}", stdin=read_blocks(local, offset), total=size - offset,
                                      progress=progress)
        if status != 0:
            raise DeviceError(f"{self.name}: writing {remote} failed "
                              f"({err.decode('utf-8', 'replace').strip()[-200:] or f'exit {status}'}).")
        try:
            written = int(out.split()[-1])
        except (IndexError, ValueError):
            written = -1
        if written != size:
            raise DeviceError(f"{self.name}: {remote} has {written} bytes after the upload, expected {size}.")

    def get(self, remote: str, local: Path) -> None:
        sftp = self._sftp_client()
        if sftp is None:
            status, out, err = self._exec(quote_argv(["cat", remote]), timeout=None, what=f"reading {remote}")
            if status != 0:
                raise DeviceError(f"{self.name}: cannot read {remote} "
                                  f"({err.decode('utf-8', 'replace').strip()[-200:]}).")
            Path(local).write_bytes(out)
            return
        try:
            sftp.get(remote, str(local))
        except FileNotFoundError:
            raise DeviceError(f"{self.name}: {remote} does not exist on the device.") from None
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if self._stopped or not self._transport().is_active():
                raise self._dropped(str(exc)) from None
            raise DeviceError(f"{self.name}: cannot read {remote} ({exc}).") from None

    def exists(self, remote: str) -> bool:
        sftp = self._sftp_client()
        if sftp is None:
            status, _, _ = self._exec(quote_argv(["sh", "-c", '[ -e "$1" ] || [ -L "$1" ]', "sh", remote]),
                                      timeout=None, what="looking for a file")
            return status == 0
        try:
            sftp.lstat(remote)
        except FileNotFoundError:
            return False
        except (EOFError, OSError, paramiko.SSHException) as exc:
            raise self._dropped(str(exc)) from None
        return True

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.done.set()
            self._watchdog = None
        for thing in (self._sftp, self._transport_obj):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # closing a dead link must never raise
                    pass
        self._sftp = None
        self._transport_obj = None
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    def __enter__(self) -> SshConnection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
