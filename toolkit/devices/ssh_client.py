"""A large push's stream through the system ``ssh`` client (OpenSSH's compiled transport) instead of paramiko.

Why: at 50 MB the CPU decides a push's speed, not round trips. paramiko's pure-Python packet path costs the
controlling host about 2x the CPU of ``ssh`` per packet, so a push over paramiko stayed at 0.58-0.67x of
``ssh host 'cat > f' < f`` on 2 shared cores however it was tuned (``ssh_window``'s docstring). Only the bytes
of a push's framed stream (:mod:`toolkit.delivery.deploy_stream`) take this route: the same device helper run
(``push``: begin's plan answered on stdout, the frames on stdin, each file hashed on arrival, ``current``
switched after every file is verified), so a cut resumes as before and nothing half-written is installed.
Commands, probes and small pushes stay on paramiko.

Exactly as strict as paramiko: the ``ssh`` client gets no configuration of its own (``-F /dev/null``: every
option is given here, from what :mod:`toolkit.devices.ssh_config` resolved for the paramiko link), accepts only
the host key paramiko has just verified on its own connection against the toolkit's known_hosts (written, alone,
to a temporary known_hosts under a fixed ``HostKeyAlias``, ``StrictHostKeyChecking yes``, the key type pinned),
never prompts (``BatchMode yes``, no password or keyboard-interactive login) and logs in with the same identity
files, certificates and agent. Where a device's setup cannot be expressed for ``ssh`` (no client on PATH, a
ProxyJump or ProxyCommand, a key passphrase only edgetk holds) the stream stays on paramiko and
:attr:`SshClientStreams.why_not` says why; a client that cannot connect or log in before the device answered
falls back too. A host key the client refuses is refused: never retried elsewhere.
"""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from toolkit.devices.connection import Progress, quote_argv
from toolkit.devices.ssh import OUT_MARK, SshConnection
from toolkit.devices.ssh import UPLOAD_STALL_S as STALL_S  # a stream the device stops taking fails then
from toolkit.devices.ssh_link import ALIVE_COUNT_MAX, ALIVE_INTERVAL_S
from toolkit.errors import DeviceTimeout, HostKeyRefused, LinkDropped
from toolkit.model.device_records import CommandResult

log = logging.getLogger(__name__)

SSH_CLIENT_MIN_BYTES = 32 << 20
"""A bundle of at least 32 MiB streams through the system ``ssh`` client; a smaller one stays on paramiko. The
client opens its own connection and logs in (key exchange and login cost the device CPU too), a fixed cost that
the cheaper packets win back only on large pushes. Measured side by side on the Dropbear stand-in (load about 2,
5 interleaved rounds; docs/benchmarks.md, "Push speed"): 2 MB 0.24 s through the client vs 0.14 s on paramiko,
17 MB 0.46 s vs 0.41 s, 34 MB 0.65 s vs 0.69 s, 52 MB 0.94 s vs 1.19 s. On the OpenSSH device the client beats
SFTP from 17 MB on (0.61 s vs 0.86 s) but loses at 2 MB (0.50 s vs 0.37 s)."""

PINNED_ALIAS = "edgetk-verified-host"  # the name the verified key is stored under in the temporary known_hosts
HOST_KEY_FAILED = "Host key verification failed"  # what ssh prints when the host's key is not the pinned one
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")  # one AES-NI call per packet; else chacha20
HOST_KEY_ALGORITHMS = {"ssh-rsa": "rsa-sha2-512,rsa-sha2-256,ssh-rsa"}  # an RSA key is offered under these names


def ssh_options(conn: SshConnection, known_hosts: Path, key_type: str) -> list[str]:
    """The client's whole configuration for ``conn``'s device (see the module docstring)."""
    opts = conn.resolved_options()
    identities = list(opts.identity_files)
    if opts.default_identities:
        from toolkit.devices.ssh_auth import DEFAULT_KEYS

        identities += [str(Path.home() / ".ssh" / n) for n in DEFAULT_KEYS if (Path.home() / ".ssh" / n).is_file()]
    settings = {
        "BatchMode": "yes", "StrictHostKeyChecking": "yes", "UserKnownHostsFile": str(known_hosts),
        "GlobalKnownHostsFile": "none", "HostKeyAlias": PINNED_ALIAS, "CheckHostIP": "no", "UpdateHostKeys": "no",
        "HostKeyAlgorithms": HOST_KEY_ALGORITHMS.get(key_type, key_type), "PasswordAuthentication": "no",
        "KbdInteractiveAuthentication": "no", "PubkeyAuthentication": "yes",
        "IdentitiesOnly": "yes" if opts.identities_only else "no", "IdentityAgent": opts.identity_agent or "none",
        "Ciphers": "^" + ",".join(PREFERRED_CIPHERS),  # first, as paramiko's link (ssh_link._prefer_aead)
        "ControlMaster": "no", "ControlPath": "none", "ForwardAgent": "no", "ForwardX11": "no",
        "ClearAllForwardings": "yes", "PermitLocalCommand": "no", "LogLevel": "ERROR",
        "ConnectTimeout": str(max(1, round(conn.timeout_s()))),
        "ServerAliveInterval": str(max(1, round(opts.server_alive_interval or ALIVE_INTERVAL_S))),
        "ServerAliveCountMax": str(opts.server_alive_count_max or ALIVE_COUNT_MAX),
    }
    argv = ["-F", "/dev/null", "-T", "-x", "-p", str(opts.port), "-l", opts.user]
    for path in identities:
        argv += ["-i", path]
    for path in opts.certificate_files:
        argv += ["-o", f"CertificateFile={path}"]
    for name, value in settings.items():
        argv += ["-o", f"{name}={value}"]
    return [*argv, "--", opts.hostname]


def why_not(conn: SshConnection, binary: str | None) -> str | None:
    """Why ``conn``'s device cannot be reached through the ``ssh`` client as paramiko reaches it; None: it can."""
    opts = conn.resolved_options()
    if binary is None:
        return "no ssh client on PATH"
    if opts.proxy_jump or opts.proxy_command:
        return "the device is reached through a ProxyJump or ProxyCommand"
    if conn.holds_passphrase:
        return "the key's passphrase is given to edgetk only ($EDGETK_SSH_PASSPHRASE)"
    if not opts.identity_files and not opts.default_identities and not opts.identity_agent:
        return "no identity file or agent to give the ssh client"
    return None


class SshClientStreams:
    """A :class:`~toolkit.delivery.deploy_stream.Streams` whose ``stream`` runs the command through the ``ssh``
    client, and through ``conn`` (paramiko) when the client cannot connect or log in (``route`` says which)."""

    def __init__(self, conn: SshConnection, binary: str) -> None:
        self.conn, self.binary = conn, binary
        self.route = f"ssh client ({binary})"

    def sftp_available(self) -> bool:
        return False  # this route is a stream, whatever the device's SFTP

    def stream(self, argv: Sequence[str], blocks: Iterable[bytes] | Callable[[str], Iterable[bytes] | None], *,
               total: int, progress: Progress | None = None, timeout: float | None = None,
               reply_end: str = "") -> CommandResult:
        """As ``SshConnection.stream``: ``argv`` with ``blocks`` as its stdin (a callable holds a conversation)."""
        name = self.conn.name
        key = self.conn.verified_host_key()  # verified on paramiko's connection just now
        with tempfile.TemporaryDirectory(prefix="edgetk-ssh-") as tmp:
            known = Path(tmp) / "known_hosts"
            known.write_text(f"{PINNED_ALIAS} {key.get_name()} {key.get_base64()}\n")
            command = f"printf %s {OUT_MARK}; exec {quote_argv(argv)}"
            run = _ClientRun([self.binary, *ssh_options(self.conn, known, key.get_name()), command], name)
            status, out, err = run.talk(blocks, mark=OUT_MARK.encode(), total=total, progress=progress,
                                        timeout=timeout, reply_end=reply_end.encode())
        said = err.strip()[-200:] or f"exit {status}"
        if status == 255 and HOST_KEY_FAILED in err:
            raise HostKeyRefused(
                f"{name}: the ssh client refused the device's host key: it is not the key edgetk verified on its "
                f"own connection a moment ago ({said}).",
                hint="Someone may be intercepting the connection, or the device's keys changed just now. Check the "
                "fingerprint on its console.")
        if status == 255 and OUT_MARK.encode() not in out:
            self.route = f"paramiko exec stream (the ssh client did not get in: {said})"
            log.info("%s: the ssh client did not get in (%s); the push goes through paramiko", name, said)
            return self.conn.stream(argv, blocks, total=total, progress=progress, timeout=timeout,
                                    reply_end=reply_end)
        if status == 255 or status < 0:
            raise LinkDropped(f"{name}: the link to the device dropped (ssh: {said}).",
                              hint="Check the network and re-run: files already sent are not sent again.")
        return CommandResult(status, self.conn.strip_noise(out).decode("utf-8", "replace"), err)


class _ClientRun:
    """One ``ssh`` process: its stdout and stderr read by threads, its stdin written here."""

    def __init__(self, argv: list[str], name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out, self.err = bytearray(), bytearray()
        self.changed = threading.Condition()
        self.last_write = time.monotonic()
        self.stalled = False
        self.readers = [threading.Thread(target=self._read, args=(pipe, buf), daemon=True)
                        for pipe, buf in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    def _read(self, pipe: io.BufferedReader, buf: bytearray) -> None:
        while chunk := pipe.read1(1 << 16):
            with self.changed:
                buf += chunk
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def _answered(self, mark: bytes, end: bytes, timeout: float | None) -> bytes | None:
        """The command's first answer (its stdout after ``mark`` up to ``end``), or None: ssh's stdout ended
        first; ``timeout`` seconds at most."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while True:
                at = self.out.find(mark)
                if at >= 0 and end in self.out[at + len(mark):]:
                    return bytes(self.out[at + len(mark):])
                if not self.readers[0].is_alive():
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.proc.kill()
                    raise DeviceTimeout(f"{self.name}: the push did not begin within {timeout:.0f} s.",
                                        hint="Raise the timeout, or look at what hangs on the device.")
                self.changed.wait(0.5 if left is None else min(left, 0.5))

    def _watch(self, done: threading.Event) -> None:
        """Kill ssh when the device has taken nothing for ``STALL_S`` (its keepalives may still be answered)."""
        while not done.wait(1.0):
            if time.monotonic() - self.last_write > STALL_S:
                self.stalled = True
                self.proc.kill()
                return

    def talk(self, blocks: Iterable[bytes] | Callable[[str], Iterable[bytes] | None], *, mark: bytes, total: int,
             progress: Progress | None, timeout: float | None, reply_end: bytes) -> tuple[int, bytes, str]:
        """Send the blocks (after the command's first answer, for a conversation): (exit status, stdout, stderr)."""
        stdin = self.proc.stdin
        assert stdin is not None
        # nothing is taken from ``blocks`` before the command started: a client that did not get in leaves them
        # whole for paramiko
        head = self._answered(mark, reply_end, timeout)
        payload: Iterable[bytes] | None = None
        if head is not None:
            payload = blocks(head.decode("utf-8", "replace")) if callable(blocks) else blocks
        done = threading.Event()
        self.last_write = time.monotonic()
        threading.Thread(target=self._watch, args=(done,), daemon=True).start()
        try:
            sent = 0
            for block in payload or ():
                stdin.write(block)
                self.last_write = time.monotonic()
                sent += len(block)
                if progress:
                    progress(sent, total)
            stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the command (or ssh) ended early: its answer or exit status says why
        finally:
            done.set()
        status = self.proc.wait()
        for reader in self.readers:
            reader.join()
        if self.stalled:
            raise DeviceTimeout(f"{self.name}: the device took no data for {STALL_S:.0f} s (the push's stream).",
                                hint="Its disk may be hung or very slow (an SD card failing?); check `dmesg`.")
        return status, bytes(self.out), self.err.decode("utf-8", "replace")


def client_streams(conn: SshConnection, *, total: int) -> tuple[SshClientStreams | None, str | None]:
    """The ``ssh`` client route for a push of ``total`` bytes to ``conn``'s device, or (None, why not): too small
    (None, None), or the device's setup cannot be given to ``ssh`` (the reason, logged)."""
    if total < SSH_CLIENT_MIN_BYTES:
        return None, None
    binary = shutil.which("ssh")
    reason = why_not(conn, binary)
    if reason is not None or binary is None:
        log.info("%s: the push goes through paramiko: %s", conn.name, reason)
        return None, reason
    return SshClientStreams(conn, binary), None
