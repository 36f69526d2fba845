"""An SSH device through paramiko (the only package that imports it): commands and files on an
:class:`~toolkit.devices.ssh_link.SshLink` (connecting, host keys, login and link state are there).

Shells that talk: a login shell that prints on start-up (a ``~/.bashrc`` echo) prefixes every command's stdout
and breaks the SFTP stream. Each command prints a marker first and whatever precedes it is dropped (and
reported once, naming the device and the fix); when SFTP cannot start, files go over exec channels
(``cat``, or one framed stream per push: ``toolkit.delivery.deploy_stream``), which that noise cannot corrupt.

Dropbear without an sftp-server (findings.md section 6): ``_sftp_client`` and ``_open_command`` say how.

Throughput: SFTP is opened with a large window so a 50 MB push is not window-bound; writes are pipelined, and
each write request carries 64 KiB instead of paramiko's 32 KiB (``SFTP_WRITE_SIZE``). paramiko ships no type
information: its channels, transports and SFTP clients are ``Any`` here.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import paramiko

from toolkit.devices.connection import Progress, quote_argv, read_blocks
from toolkit.devices.host_facts import host_id, remember_sftp, sftp_known
from toolkit.devices.ssh_auth import fingerprint
from toolkit.devices.ssh_link import SshLink
from toolkit.devices.ssh_signal import signal_status
from toolkit.devices.ssh_window import WindowSender
from toolkit.errors import DeviceError, DeviceTimeout
from toolkit.model.device_records import CommandResult

log = logging.getLogger(__name__)

SFTP_WINDOW = 1 << 27
SFTP_MAX_PACKET = 1 << 15
SFTP_WRITE_SIZE = 1 << 16  # bytes per SFTP write request (paramiko: 32 KiB; OpenSSH's server takes 256 KiB)
OUT_MARK = "__edgetk_out_8c1e__"  # printed before each command's own output: what precedes it is shell noise
UPLOAD_STALL_S = 60.0  # an upload whose data the device stops taking (a hung disk, sshd still alive) fails then


def close_quietly(chan: paramiko.Channel) -> None:
    """Close ``chan`` after its link failed: closing sends a message, which a dead link refuses (EOFError) and
    which must not hide the failure being reported (a push cut mid-stream raised a bare EOFError so)."""
    try:
        chan.close()
    except (paramiko.SSHException, EOFError, OSError):
        pass


class SshConnection(SshLink):
    """A lazily opened SSH connection to one device: commands, and files over SFTP or exec channels."""

    exit_signal: str | None = None  # the signal that killed the last command that ended (``SIGKILL``), or None

    # ----------------------------------------------------------------------------------------- commands

    def strip_noise(self, out: bytes) -> bytes:
        """A command's stdout without what the login shell printed before the marker (reported once): every
        route that runs a command through this device's login shell (the ``ssh`` client's too) reads it so."""
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


    def _open_command(self, command: str, what: str) -> tuple[paramiko.Transport, paramiko.Channel]:
        """A session channel running ``command``. A channel the device refuses, or a connection that closes while
        the channel opens, is tried once more on a fresh connection before it counts as a failure: the command
        has not started then, and Dropbear sometimes ends a connection just when a channel opens (findings.md 6)."""
        for attempt in (1, 2):
            transport = self.transport()
            try:
                chan = transport.open_session(window_size=SFTP_WINDOW, max_packet_size=SFTP_MAX_PACKET,
                                              timeout=self.timeout_s())
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
            stdin = stdin(self.strip_noise(b"".join(out)))
            timeout = None  # the files take what they take; a stalled device is caught per block below
        try:
            if stdin is not None:
                chan.settimeout(UPLOAD_STALL_S)  # a send waits for window space at most this long
                sent, sender = 0, WindowSender(chan)
                for block in itertools.chain(stdin, (None,)):  # None: the end, the carried tail goes
                    try:
                        if block is None:
                            sender.flush()
                            break
                        sender.send(block)
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
            close_quietly(chan)
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
            close_quietly(chan)
            raise self._dropped(f"{what}: {type(exc).__name__}: {exc}") from None

    def _ended(self, chan: paramiko.Channel, transport: paramiko.Transport, out: list[bytes], err: list[bytes],
               what: str) -> tuple[int, bytes, bytes]:
        """The ended command's exit status (``-SIGNUM`` when a signal killed it: ssh_signal) and output (the
        channel closed)."""
        try:
            status = chan.recv_exit_status()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self._dropped(f"{what}: {type(exc).__name__}: {exc}") from None
        finally:
            chan.close()
        status, killed = signal_status(chan, status)
        self.exit_signal = killed  # of the last command that ended (run reads it)
        if status == -1 and killed is None and not transport.is_active():
            raise self._dropped(f"the connection closed during {what}")
        return status, self.strip_noise(b"".join(out)), b"".join(err)

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
        return CommandResult(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                             self.exit_signal)

    # ----------------------------------------------------------------------------------------- files

    def _facts_key(self, transport: paramiko.Transport) -> str:
        opts = self.resolved_options()
        return host_id(opts.user, opts.hostname, opts.port, fingerprint(transport.get_remote_server_key()))

    def _sftp_client(self) -> paramiko.SFTPClient | None:
        """SFTP, or None when it cannot start (no sftp-server, as with Dropbear; a talking login shell corrupts
        its stream): files go over exec channels then. Whether it starts is asked once per device and remembered
        (:mod:`toolkit.devices.host_facts`); after a failed start this connection is dropped and the next call
        opens a fresh one, because Dropbear may end a connection whose SFTP request failed when the next channel
        opens (findings.md section 6)."""
        if self._sftp is None and self._sftp_broken is None:
            transport = self.transport()
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
            with sftp.file(remote, "r+b" if offset else "wb") as target:
                target.set_pipelined(True)
                target.MAX_REQUEST_SIZE = SFTP_WRITE_SIZE  # shadows paramiko's class constant
                target.chmod(0o644)
                if offset:
                    target.seek(offset)
                sent = 0
                for block in read_blocks(local, offset):
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
            if self._stopped or not self.transport().is_active():
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

