"""An SSH link through paramiko: where and how to connect, the host key and the login, and the link's state.

Where to connect, and how, comes from the user's OpenSSH configuration as ``ssh`` reads it
(:mod:`toolkit.devices.ssh_config`: Include, ProxyJump, ProxyCommand, IdentityFile/IdentitiesOnly/
IdentityAgent/CertificateFile, UserKnownHostsFile/GlobalKnownHostsFile/HostKeyAlias/HashKnownHosts,
ConnectTimeout, ServerAliveInterval/CountMax); an option it cannot follow is refused by name. Host keys and
the login (public keys only): :mod:`toolkit.devices.ssh_auth`.

Reliability (findings.md sections 4-5): a dead link is noticed by TCP (``TCP_USER_TIMEOUT`` on a socket we
create, TCP keepalives). A device that stops answering while its kernel still ACKs TCP (a frozen userland, a
hung SD card, ``kill -STOP`` of its sshd) is noticed by a watchdog thread per connection
(:mod:`toolkit.devices.ssh_watch`): every byte from the server refreshes a clock; after ``ServerAliveInterval``
seconds of silence (default 3) a keepalive that demands a reply is sent, and after ``ServerAliveCountMax``
intervals (default 4) of silence the connection is cut and every call on it raises
:class:`~toolkit.errors.DeviceStopped`, whatever step it was in (connect, a command, an upload), so a frozen
device fails within about 15 s and never hangs the tool. Which one it was is told by the kernel: a frozen
device's TCP stack still acknowledges (``tcp_info.tcpi_last_ack_recv``), a dead link's does not
(:class:`~toolkit.errors.LinkDropped`); ``TCP_USER_TIMEOUT`` is set past the watchdog's limit so that the
watchdog speaks first. Commands have their own deadline on top (:class:`~toolkit.errors.DeviceTimeout`).

Ciphers: AES-GCM first when the server has it (one OpenSSL call per packet here: the least CPU on the controlling
host, which a fleet push shares; about 15% less time for a 50 MB upload to OpenSSH than AES-CTR + HMAC), then
ChaCha20-Poly1305 (:mod:`toolkit.devices.ssh_chacha`; Dropbear as shipped has no GCM, and its software AES-CTR +
HMAC cost the device 0.2-0.4 s more CPU per 50 MB than ChaCha20), then paramiko's order. paramiko ships no type
information: its objects are ``Any`` here.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from types import TracebackType
from typing import Self

import paramiko

from toolkit.devices.spec import DeviceSpec, parse_spec
from toolkit.devices.ssh_config import SshOptions, resolve
from toolkit.devices.ssh_chacha import CHACHA, ChachaTransport
from toolkit.devices.ssh_auth import authenticate, check_host_key, home_relative, prefer_known_key_types
from toolkit.devices.ssh_watch import ByteStream, Watchdog, WatchedSocket
from toolkit.errors import DeviceError, DeviceStopped, DeviceUnreachable, LinkDropped

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


def _prefer_aead(transport: paramiko.Transport) -> None:
    """AES-GCM, then ChaCha20-Poly1305, first (see the module docstring)."""
    first = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", CHACHA)
    options = transport.get_security_options()
    options.ciphers = tuple(sorted(options.ciphers, key=lambda c: first.index(c) if c in first else len(first)))


class SshLink:
    """A lazily opened SSH link to one device: connected, host key checked, logged in; what it knows of its state."""

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
        self._watchdog: Watchdog | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_broken: str | None = None  # why SFTP cannot be used: files then go over exec channels
        self._jump: SshLink | None = None
        self._lost: LinkDropped | None = None  # once the link is gone: no silent reconnect after that
        self._stopped: str | None = None  # the watchdog reported (watchdog_cut): the device stopped answering
        self._silent: str | None = None  # the watchdog reported silence and no TCP acknowledgements (a dead link)
        self._noise_reported = False
        self.options: SshOptions | None = None
        self.shell_noise: str | None = None  # what the login shell printed before a command, if anything

    # ----------------------------------------------------------------------------------------- connecting

    def resolved_options(self) -> SshOptions:
        """How this device is reached, as ``ssh`` would read the user's configuration for it (resolved once):
        the ``ssh`` client route (:mod:`toolkit.devices.ssh_client`) is configured from exactly these."""
        assert self.spec.host is not None
        if self.options is None:
            self.options = resolve(self.spec.host, user=self.spec.user, port=self.spec.port,
                                   identity_file=self.spec.identity_file, proxy_jump=self._proxy_jump)
        return self.options

    def timeout_s(self) -> float:
        """Seconds to wait for the device to connect and answer a channel: the caller's ``connect_timeout``, else
        the configuration's ConnectTimeout, else 15 s."""
        return self.connect_timeout or self.resolved_options().connect_timeout or DEFAULT_CONNECT_TIMEOUT_S

    @property
    def holds_passphrase(self) -> bool:
        """Whether edgetk holds the key's passphrase (given here or in $EDGETK_SSH_PASSPHRASE): another client
        (the system ``ssh``) could not unlock the key then. The passphrase itself is never handed out."""
        return bool(self._passphrase)

    def verified_host_key(self) -> paramiko.PKey:
        """The device's host key, as verified against the known_hosts on this (connected) link."""
        return self.transport().get_remote_server_key()

    def watchdog_cut(self, what: str, *, link_gone: bool) -> None:
        """The watchdog's report, from its thread, just before it cuts the link: ``what`` was silent, and either
        the link itself is gone (``link_gone``: nothing acknowledged TCP either) or the device stopped answering.
        Every later call on this link raises accordingly (``_dropped``)."""
        if link_gone:
            self._silent = what
        else:
            self._stopped = what

    def _socket(self, hostname: str, port: int, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection((hostname, port), timeout=timeout)
        except socket.gaierror:
            files = ", ".join(home_relative(f) for f in (self.options.config_files if self.options else ())[:3])
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
        opts = self.resolved_options()
        watchdog_s = (opts.server_alive_interval or ALIVE_INTERVAL_S) * (opts.server_alive_count_max or ALIVE_COUNT_MAX)
        for opt, value in (
            # the watchdog speaks first, so that a frozen device is told apart from a dead link (see Watchdog)
            ("TCP_USER_TIMEOUT", max(USER_TIMEOUT_MS, int((watchdog_s + 5) * 1000))),
            ("TCP_KEEPIDLE", KEEPALIVE_S),
            ("TCP_KEEPINTVL", KEEPALIVE_S),
            ("TCP_KEEPCNT", 3),
            ("TCP_NODELAY", 1),
        ):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
        return sock

    def _open_stream(self, opts: SshOptions, timeout: float) -> ByteStream:
        """A byte stream to the device's sshd: through the jump host(s), a ProxyCommand, or straight."""
        if opts.proxy_jump:
            chain = [j.strip() for j in opts.proxy_jump.split(",") if j.strip()]
            self._jump = SshLink(
                parse_spec(chain[-1]), trust_new_host=self.trust_new_host, known_hosts=self.known_hosts,
                connect_timeout=self.connect_timeout, passphrase=self._passphrase, proxy_jump=",".join(chain[:-1]),
            )
            transport = self._jump.transport()
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
        opts = self.resolved_options()
        timeout = self.timeout_s()
        try:
            stream = WatchedSocket(self._open_stream(opts, timeout))
        except DeviceError:
            self.close()
            raise
        started_recv = stream.last_recv
        transport = ChachaTransport(stream)
        _prefer_aead(transport)
        transport.banner_timeout = timeout
        # the watchdog covers the handshake too: a device that freezes while we log in is noticed as well
        self._watchdog = Watchdog(self, transport, stream, opts.server_alive_interval or ALIVE_INTERVAL_S,
                                  opts.server_alive_count_max or ALIVE_COUNT_MAX)
        try:
            prefer_known_key_types(self.name, transport, opts, self.known_hosts)
            transport.start_client(timeout=timeout)
            self._watchdog.start()
            check_host_key(self.name, transport, opts, known_hosts=self.known_hosts,
                           trust_new_host=self.trust_new_host)
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
        return transport


    def _authenticate(self, transport: paramiko.Transport, opts: SshOptions, timeout: float) -> None:
        """Log in (keys only; a password login for add-key overrides this)."""
        authenticate(self.name, transport, opts, timeout, passphrase=self._passphrase)

    # ----------------------------------------------------------------------------------------- link state

    def transport(self) -> paramiko.Transport:
        """The live, logged-in transport (connecting on first use); a link that is gone raises."""
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

    # ----------------------------------------------------------------------------------------- closing

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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
