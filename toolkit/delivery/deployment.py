"""Push a bundle to a device, install it atomically, roll back, list and remove (issue 5).

The host decides, the device does the file work: each step is one call of the stdlib-only helper
(``toolkit/device_side/device_helper.py``) run with the device's Python, its arguments passed as separate argv
words, quoted for the remote shell by the connection. Every helper call is a fresh Python on the device (tens
of milliseconds each), so a push makes exactly two, with the SFTP upload between them:

``begin``
  1. probes the device (arch, free disk; kept as ``Device.info()`` for the rest of the session) and refuses a
     bundle built for another arch (exit 2) unless ``force``, before anything is locked or written;
  2. takes the device-side lock ``~/.edgetk/locks/<name>`` (atomic mkdir; broken only when its holder is
     provably gone, never by age: :mod:`toolkit.delivery.locks`), so two deploys of one bundle to one device run one
     after the other, the waiting one saying whom it waits for; any failure after this point releases the lock
     before the helper exits;
  3. prepares ``~/.edgetk/bundles/<name>/<version>/``: files already there with the right sha256, or found
     with that sha256 in another installed version (hard-linked), are not sent; refuses early when the disk
     cannot hold what is left (with ``prune``, old versions go first, never the current or rollback target).
upload
  4. the rest, with progress on stderr; a file whose upload was cut short is resumed from where it stopped
     when the bytes already there are a prefix of it (the device hashes them, the host compares); a failed
     write (disk full) calls ``abort``: the partial version is removed and the lock released in one call.
``finish``
  5. inflates compressed uploads, verifies every file's sha256 ON the device, fixes permissions (0644/0755),
     switches ``current`` with an atomic rename, keeps the last ``keep`` versions and releases the lock (in a
     ``finally``). The hashing is mostly done by then: a child that ``begin`` forks (the follower) hashes each
     file sent as it is while it arrives, and ``begin`` hashed the files it found in place; ``finish`` takes
     such a digest only when it is the expected one and the file's stat (inode, size, mtime, ctime) is the same
     as when it was hashed, and hashes every other file itself (compressed or resumed uploads, a file that
     changed). Like any stat check, a same-size rewrite by another process within one filesystem timestamp
     tick of the hashing would not show; the upload itself writes each byte once, before it is hashed.

On a device where SFTP does not start (Dropbear without sftp-server), the whole push is ONE helper run on one
exec channel (``push``): it answers ``begin``'s plan on stdout, then takes every missing file the host sends on
the same stdin as a framed stream, hashes each as it arrives, and finishes (``toolkit.delivery.deploy_stream``).

Any other failure on the host between the two (an exception, Ctrl-C) releases the lock with ``unlock``; a link
that drops cannot, and the next deploy breaks that lock at once because its holder (the dead session's sshd
process) is gone. The partial version stays for the next push to complete; ``current`` is switched only after
every file is verified, so the running version is never touched by a failed push.

The host hashes each bundle file once per process (``toolkit.delivery.bundle.sha256_file`` keeps a digest per file stat,
trusted only for files last changed well before they were hashed): reading the bundle verifies the artifacts,
and the push's listing reuses those digests.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TextIO

from toolkit.delivery.bundle import Bundle
from toolkit.delivery.deploy_stream import Outgoing, StreamedPush, streaming
from toolkit.delivery.deploy_wire import compress_files, resume_offsets
from toolkit.devices.connection import Connection, Progress
from toolkit.devices.spec import DeviceSpec
from toolkit import device_side
from toolkit.delivery import locks
from toolkit.errors import DeviceDiskFull, DeviceError, DeviceShellNoise, LinkDropped, UsageError
from toolkit.delivery.locks import LOCK_TIMEOUT_S, DeviceLock
from toolkit.model.platform import accepted_arches, normalize_arch
from toolkit.model.device_records import CommandResult

BASE = ".edgetk"
KEEP_VERSIONS = 3
HELPER_TIMEOUT_S = 120.0
GZ_SUFFIX = ".edgetk-gz"  # the device helper's name for a compressed upload, inflated by its `inflate`

@lru_cache(maxsize=1)
def helper_source() -> str:
    return device_side.source_path(device_side.HELPER_FILE).read_text()


HELPER_DIR = f"{BASE}/helper"
FRAME_BEGIN = "\x1eedgetk-json\n"  # the helper prints its JSON between these (a noisy process cannot break it)
FRAME_END = "\n\x1eedgetk-end\n"

# The ``-c`` program that runs the helper installed once per device at ~/.edgetk/helper/<sha256>.py (the host
# installs it when this program answers "helper_missing"), from a compiled copy cached next to it when there is
# one (compiling the helper costs more than starting Python; a slow ARM board pays tens of milliseconds per
# call). The cache file is named by the source's sha256 and the device Python's bytecode tag and exact version,
# holds a CRC-32 of the code, is written atomically with mode 0644 and used only when it is the user's own and
# not writable by others; the installed source is compiled only when its sha256 is the expected one. Any cache
# problem falls back to compiling the source, so the cache can only save time. The command line stays ~1.5 KB
# whatever the helper's size (it used to carry the whole 30 KB helper with every call).
_BOOT = """import marshal, os, sys
d = os.path.join(os.path.expanduser("~"), ".edgetk", "helper")
src = os.path.join(d, "HASH.py")
p = os.path.join(d, "HASH-%s-%x.bin" % (sys.implementation.cache_tag, sys.hexversion))
code = None
try:
    from binascii import crc32
    with open(p, "rb") as f:
        st = os.fstat(f.fileno())
        data = f.read()
    if st.st_uid == os.getuid() and not st.st_mode & 0o022 and int(data[:8], 16) == crc32(data[8:]):
        code = marshal.loads(data[8:])
except Exception:
    pass
if code is None:
    import hashlib
    try:
        with open(src, "rb") as f:
            text = f.read()
    except (IOError, OSError):
        text = b""
    if hashlib.sha256(text).hexdigest() != "FULL":
        sys.stdout.write('FRAME_BEGIN{"kind": "helper_missing", "error": "the helper is not installed"}FRAME_END')
        sys.exit(3)
    code = compile(text, src, "exec")
    t = "%s.%d" % (p, os.getpid())
    try:
        os.umask(0o022)
        data = marshal.dumps(code)
        with open(t, "wb") as f:
            f.write(b"%08x" % crc32(data) + data)
        os.chmod(t, 0o644)
        os.replace(t, p)
    except Exception:
        try:
            os.remove(t)
        except Exception:
            pass
sys.argv[0] = src
exec(code, {"__name__": "__main__"})
"""


@lru_cache(maxsize=1)
def helper_digest() -> str:
    import hashlib

    return hashlib.sha256(helper_source().encode()).hexdigest()


@lru_cache(maxsize=1)
def helper_boot() -> str:
    """The ``-c`` program that runs the installed helper (see ``_BOOT``)."""
    frame = {"FRAME_BEGIN": FRAME_BEGIN.encode("unicode_escape").decode(),
             "FRAME_END": FRAME_END.encode("unicode_escape").decode()}
    boot = _BOOT.replace("HASH", helper_digest()[:32]).replace("FULL", helper_digest())
    for key, value in frame.items():
        boot = boot.replace(key, value)
    return boot


def unframe(stdout: str) -> str | None:
    """The helper's JSON from between its frame markers (None: no frame, the helper did not get to print)."""
    start = stdout.rfind(FRAME_BEGIN)
    if start < 0:
        return None
    end = stdout.find(FRAME_END, start)
    return stdout[start + len(FRAME_BEGIN):end if end >= 0 else None]


def validate_name(name: str) -> str:
    """A bundle name is a single directory name on the device: no ``/``, no ``..``, no control characters.

    Anything else (spaces, quotes, ``;``, ``$()``) is allowed: every remote command quotes its arguments.
    """
    if (
        not name
        or name in (".", "..")
        or name.startswith((".", "-"))
        or "/" in name
        or "\\" in name
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
        or len(name.encode()) > 200
    ):
        raise UsageError(
            f"The bundle name {name!r} cannot be a directory name on a device.",
            hint="Use letters, digits, '.', '_' and '-', not starting with '.' or '-' (edgetk convert --name).",
        )
    return name


def bundle_dir(name: str) -> str:
    return f"{BASE}/bundles/{validate_name(name)}"


def version_dir(name: str, version: str) -> str:
    return f"{bundle_dir(name)}/{version}"


# --------------------------------------------------------------------------------------------- device calls


@dataclass
class Device:
    """A connection plus what we learned about the device; ``helper`` runs one helper command."""

    spec: DeviceSpec
    conn: Connection
    _info: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def helper_python(self) -> str:
        """The helper is stdlib-only: on ``local`` this very interpreter runs it (no PATH lookup, no shims)."""
        if self.spec.python:
            return self.spec.python
        return sys.executable if self.spec.is_local else "python3"

    def install_helper(self) -> None:
        """Copy the helper to ``~/.edgetk/helper/<sha256>.py`` (atomically: a temp name, then a rename)."""
        final = f"{HELPER_DIR}/{helper_digest()[:32]}.py"
        temp = f"{final}.{uuid.uuid4().hex[:8]}.tmp"
        made = self.conn.run(["mkdir", "-p", HELPER_DIR], timeout=HELPER_TIMEOUT_S)
        if not made.ok:
            raise DeviceError(f"{self.spec.name}: cannot create {HELPER_DIR} on the device "
                              f"({made.stderr.strip()[-200:]}).", hint="Check the free disk and the home directory.")
        self.conn.put(device_side.source_path(device_side.HELPER_FILE), temp)
        moved = self.conn.run(["mv", "-f", temp, final], timeout=HELPER_TIMEOUT_S)
        if not moved.ok:
            raise DeviceError(f"{self.spec.name}: cannot install the helper ({moved.stderr.strip()[-200:]}).")

    def helper_argv(self, command: str, *args: str) -> list[str]:
        # -S: the helper is stdlib-only, and site start-up (.pth files) costs tens of ms per call on a device
        return [self.helper_python, "-S", "-c", helper_boot(), command, *args]

    def helper(self, command: str, *args: str, timeout: float = HELPER_TIMEOUT_S) -> dict[str, Any]:
        result = self.conn.run(self.helper_argv(command, *args), timeout=timeout)
        data = _helper_json(result.stdout)
        if result.returncode == 3 and isinstance(data, dict) and data.get("kind") == "helper_missing":
            self.install_helper()  # once per device and helper version
            result = self.conn.run(self.helper_argv(command, *args), timeout=timeout)
        return self.answer(command, result)

    def answer(self, command: str, result: CommandResult) -> dict[str, Any]:
        """The helper's JSON answer to ``command``, or the error its run says (a refusal, no Python, noise)."""
        data = _helper_json(result.stdout)
        if result.returncode == 3 and isinstance(data, dict):
            if data.get("kind") in ("not_installed", "no_previous", "usage"):
                raise UsageError(
                    f"{self.spec.name}: {str(data.get('error')).rstrip('.')}.",
                    hint="See `edgetk status` for what is installed.",
                )
            refused = HelperDiskFull if data.get("kind") == "disk_full" else HelperRefused
            raise refused(self.spec.name, data)
        if result.returncode != 0 or not isinstance(data, dict):
            tail = (result.stderr.strip().splitlines() or ["no output"])[-1][:300]
            if result.returncode == 127 or "not found" in tail or "No such file" in tail:
                raise DeviceError(
                    f"{self.spec.name}: cannot run {self.helper_python!r} on the device ({tail}).",
                    hint="Install python3 there, or set `python = \"/path/to/python\"` for it in the inventory.",
                )
            if unframe(result.stdout) is None and result.stdout.strip():
                raise DeviceShellNoise(
                    f"{self.spec.name}: the device-side step {command!r} printed no answer, only other text "
                    f"({result.stdout.strip().splitlines()[0][:80]!r}).",
                    hint="Something on the device prints to stdout when Python starts (a sitecustomize, the login "
                    "shell): make it print to stderr, or guard it with `[ -z \"$PS1\" ] && return` in ~/.bashrc.",
                )
            raise DeviceError(f"{self.spec.name}: the device-side step {command!r} failed ({tail}).")
        return data

    def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self.helper("info")
        return self._info

    @property
    def python(self) -> str:
        """The Python that runs the runner: the spec's, else ~/.edgetk/config.json's, else python3 on the device's
        PATH; on ``local``, the interpreter running edgetk (a venv install has its runtimes there, not in PATH's)."""
        fallback = sys.executable if self.spec.is_local else "python3"
        return self.spec.python or self.info().get("config_python") or fallback


def _helper_json(stdout: str) -> dict[str, Any] | None:
    text = unframe(stdout)
    if text is None:
        text = stdout  # an older helper on the device, or none: plain JSON
    try:
        data = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


class HelperRefused(DeviceError):
    """The device-side helper refused a step; ``kind`` says which refusal (disk_full, integrity, locked...)."""

    def __init__(self, device: str, data: dict[str, Any]) -> None:
        self.kind = str(data.get("kind"))
        self.data = data
        message = f"{device}: {str(data.get('error')).rstrip('.')}."
        hints = {
            "disk_full": f"Remove old versions and keep the current one: edgetk prune {data.get('name') or 'NAME'} "
            f"--device {device} (or re-run the deploy with --prune); `edgetk status` lists what is installed.",
            "integrity": "Re-run the deploy: files with a wrong hash are sent again.",
        }
        super().__init__(message, hint=hints.get(self.kind))


class HelperDiskFull(HelperRefused, DeviceDiskFull):
    """The helper's refusal ``disk_full``: what it needs is more than the device's disk has free."""


# --------------------------------------------------------------------------------------------- progress


class UploadProgress:
    """Bytes sent and rate, on stderr, at most twice a second per device (threads write whole lines)."""

    _lock = threading.Lock()

    def __init__(self, device: str, total: int, *, stream: TextIO | None = None, interval: float = 0.5) -> None:
        self.device = device
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.done = 0
        self.started = time.perf_counter()
        self._last = self.started

    def file_progress(self, base: int) -> Any:
        def callback(sent: int, _total: int) -> None:
            self.done = base + sent
            now = time.perf_counter()
            if now - self._last >= self.interval:
                self._last = now
                self._line("uploading")

        return callback

    def _line(self, what: str) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-6)
        with self._lock:
            print(
                f"{self.device}: {what} {self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB "
                f"({self.done / 1e6 / elapsed:.1f} MB/s)",
                file=self.stream,
                flush=True,
            )

    def finish(self) -> None:
        if self.total:
            self._line("sent")


# --------------------------------------------------------------------------------------------- push


@dataclass(frozen=True)
class PushResult:
    device: str
    name: str
    version: str
    arch: str
    files_total: int
    files_sent: int
    files_reused: int
    bytes_total: int
    bytes_sent: int
    seconds: float
    previous: str | None
    removed: tuple[str, ...] = ()
    bytes_resumed: int = 0  # bytes of cut-short uploads that were already on the device and not sent again
    files_compressed: int = 0  # files sent gzip-compressed (compress=True, where it paid)
    bytes_uncompressed: int = 0  # what the sent files hold once inflated (== bytes_sent without compression)
    warnings: tuple[str, ...] = ()  # told at once on stderr too (e.g. the device's python has no numpy)
    lock: locks.LockNote = locks.LockNote()  # whom this push waited for, which dead holder's lock it broke
    previous_by: str | None = None  # who installed the version this push replaced ("host (pid N)")
    pruned: tuple[str, ...] = ()  # old versions deploy --prune removed to make room

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "version": self.version, "arch": self.arch, "files_total": self.files_total,
            "files_sent": self.files_sent, "files_reused": self.files_reused, "bytes_total": self.bytes_total,
            "bytes_sent": self.bytes_sent, "seconds": round(self.seconds, 3), "previous": self.previous,
            "removed": list(self.removed), "bytes_resumed": self.bytes_resumed,
            "files_compressed": self.files_compressed, "bytes_uncompressed": self.bytes_uncompressed,
            "warnings": list(self.warnings), "lock": self.lock.to_dict(), "previous_by": self.previous_by,
            "pruned": list(self.pruned),
        }


def check_arch(bundle: Bundle, device: Device) -> str:
    arch = str(device.info().get("arch") or "unknown")
    wanted = bundle.manifest.target_arch
    if wanted and normalize_arch(wanted) != normalize_arch(arch):
        raise _arch_refused(bundle, device, arch)
    return arch


def _arch_refused(bundle: Bundle, device: Device, arch: str) -> UsageError:
    return UsageError(
        f"{device.spec.name}: the bundle {bundle.name!r} is built for {bundle.manifest.target_arch} "
        f"(target {bundle.manifest.target or 'unknown'}), but the device is {arch}.",
        hint="Convert for the device's target (edgetk convert --target ...), or pass --force to deploy anyway.",
    )


def push(
    device: Device,
    bundle: Bundle,
    *,
    force: bool = False,
    keep: int = KEEP_VERSIONS,
    lock_timeout: float = LOCK_TIMEOUT_S,
    break_lock: bool = False,
    prune: bool = False,
    progress_stream: TextIO | None = None,
    compress: bool = False,
) -> PushResult:
    """Install ``bundle`` on the device and make it current (see the module docstring for the steps).

    With ``compress``, a file is sent gzip-compressed when that saves at least ``deploy_wire.COMPRESS_MIN_SAVING`` of it
    (and the device's Python has zlib); the device inflates it and ``finish`` verifies the sha256 of the
    inflated file, as for any other. ``bytes_sent`` then counts the compressed bytes that crossed the link.
    ``break_lock`` breaks the bundle's lock whoever holds it; ``prune`` removes old versions (never the current
    one or the rollback target) when the disk cannot hold the new one (see :mod:`toolkit.delivery.locks`).
    """
    name = validate_name(bundle.name)
    started = time.perf_counter()
    files = bundle.files()  # hashed once per process while unchanged (toolkit.delivery.bundle.sha256_file)
    listing = json.dumps([[f.path, f.sha256, f.bytes] for f in files])
    sizes = {f.path: f.bytes for f in files}
    digests = {f.path: f.sha256 for f in files}
    vdir = version_dir(name, bundle.version)
    token = uuid.uuid4().hex
    arches = [] if force else accepted_arches(bundle.manifest.target_arch)
    streams = streaming(device.conn)  # no SFTP there: begin, the files and finish go as one run on one channel
    asked = locks.request("deploy", version=bundle.version, break_lock=break_lock, prune=prune)
    runner_python = device.spec.python or (sys.executable if device.spec.is_local else "")
    with tempfile.TemporaryDirectory(prefix="edgetk-gz-") as packed_dir:
        sending: dict[str, Any] = {}

        def plan_files(plan: dict[str, Any]) -> dict[str, Any]:
            """What to send, from begin's plan (told once: the probe reused, the setup warnings printed)."""
            if not sending:
                info = plan.get("info")
                if isinstance(info, dict):
                    device._info = info  # the probe of this push, reused by whatever follows on this device (check)
                sending["warnings"] = _setup_warnings(device, info if isinstance(info, dict) else {})
                for warning in sending["warnings"]:
                    print(f"warning: {warning}", file=progress_stream if progress_stream is not None else sys.stderr,
                          flush=True)
                missing = [str(m) for m in plan.get("missing", [])]
                offsets = resume_offsets(bundle, plan.get("partial") or {}, sizes)
                packed: dict[str, Path] = {}
                if compress and device.info().get("zlib", False):
                    # a cut-short raw upload is resumed as it is; everything else may go compressed
                    packed = compress_files(bundle, [m for m in missing if m not in offsets], Path(packed_dir))
                wire = {m: packed[m].stat().st_size if m in packed else sizes[m] - offsets.get(m, 0) for m in missing}
                sending.update(missing=missing, offsets=offsets, packed=packed, wire=wire,
                               progress=UploadProgress(device.spec.name, sum(wire.values()), stream=progress_stream))
            return sending

        def outgoing(plan: dict[str, Any]) -> tuple[list[Outgoing], Progress | None]:
            plan_files(plan)
            packed, offsets = sending["packed"], sending["offsets"]
            return [Outgoing(rel, packed.get(rel, bundle.path / rel), offsets.get(rel, 0), rel in packed,
                             digests[rel], sizes[rel]) for rel in sending["missing"]], \
                sending["progress"].file_progress(0)

        streamed = None if streams is None else StreamedPush(
            device, streams, lambda wait: [name, bundle.version, listing, str(wait), asked, token, json.dumps(arches),
                                           runner_python, str(keep)],
            reply_end=FRAME_END, plan=outgoing, timeout=HELPER_TIMEOUT_S)
        try:
            # follow: the device hashes files sent as they are while they arrive (not compressed ones)
            plan, lock = locks.acquire(device, name, streamed.begin if streamed is not None else lambda wait: device.helper(
                "begin", name, bundle.version, listing, str(wait), asked, token, json.dumps(arches),
                "0" if compress else "1", runner_python, timeout=wait + HELPER_TIMEOUT_S),
                timeout=lock_timeout, stream=progress_stream)
        except HelperRefused as refused:
            if refused.kind == "arch":
                raise _arch_refused(bundle, device, str(refused.data.get("arch"))) from None
            raise
        released = False  # the lock is the device's to release once finish or abort ran there
        try:
            plan_files(plan)
            arch = str(device.info().get("arch"))  # begin's probe (plan_files keeps it)
            missing, offsets, packed, wire = (sending[k] for k in ("missing", "offsets", "packed", "wire"))
            progress = sending["progress"]
            sent = 0
            if streamed is not None:
                try:  # the device received and finished the push in the same run as begin
                    done = streamed.finished()
                except LinkDropped:
                    raise
                except DeviceError as exc:
                    released = True
                    _abort_after_write_error(device, name, bundle.version, token, exc)
                released, sent = True, sum(wire.values())
            for rel in missing if streamed is None else []:
                offset = offsets.get(rel, 0)
                local, remote = (packed[rel], f"{vdir}/{rel}{GZ_SUFFIX}") if rel in packed else (
                    bundle.path / rel, f"{vdir}/{rel}")
                try:
                    device.conn.put(local, remote, progress=progress.file_progress(sent), offset=offset)
                except LinkDropped:
                    raise  # a dead link (or a device that stopped answering): no clean-up call can get through
                except DeviceError as exc:
                    released = True  # abort releases the lock (or the link is gone and it goes stale)
                    _abort_after_write_error(device, name, bundle.version, token, exc)
                sent += wire[rel]
            progress.done = sent
            progress.finish()
            if streamed is None:
                released = True  # finish releases the lock in a finally, whatever it answers
                done = device.helper("finish", name, bundle.version, listing, str(keep), token,
                                     json.dumps(sorted(packed)))
        except LinkDropped:
            raise  # no reconnect just to unlock: the lock's holder (that session) is gone, the next deploy breaks it
        except BaseException:
            if not released:
                _release_quietly(device, name, token)
            raise
    warnings = sending["warnings"]
    return PushResult(
        device=device.spec.name, name=name, version=bundle.version, arch=arch, files_total=len(files),
        files_sent=len(missing), files_reused=len(plan.get("reused", [])), bytes_total=sum(sizes.values()),
        bytes_sent=sent, seconds=time.perf_counter() - started, previous=done.get("previous"),
        removed=tuple(done.get("removed", [])), bytes_resumed=sum(offsets.values()),
        files_compressed=len(packed), bytes_uncompressed=sum(sizes[m] - offsets.get(m, 0) for m in missing),
        warnings=tuple(warnings), lock=lock, previous_by=_by(done.get("previous_by")),
        pruned=tuple((plan.get("pruned") or {}).get("removed", [])),
    )


def _setup_warnings(device: Device, info: dict[str, Any]) -> list[str]:
    """Told at the start of a push, not after it: the runner's Python lacks numpy (or does not start)."""
    python = info.get("runner_python") or device.spec.python or "python3"
    where = device.spec.name
    if info.get("numpy") is False:
        return [f"{where}: {python} on the device has no numpy, so `edgetk check` cannot run there. Install the "
                f"runtimes with: edgetk devices setup --device {where}"]
    if "numpy" in info and info.get("numpy") is None:
        return [f"{where}: {python} does not start on the device, so `edgetk check` cannot run there. Set "
                f"`python` for it in the inventory, or run: edgetk devices setup --device {where}"]
    return []


def _release_quietly(device: Device, name: str, token: str) -> None:
    """Release a push's lock after a host-side failure (a dead link cannot: see ``push``)."""
    try:
        device.helper("unlock", name, token)
    except DeviceError:
        pass


def _abort_after_write_error(device: Device, name: str, version: str, token: str, exc: DeviceError) -> None:
    """A write failed on a live link (typically a full disk): remove the partial version and release the lock
    (one helper call), say why."""
    free = None
    try:
        free = device.helper("abort", name, version, token).get("free_bytes")
    except LinkDropped:
        raise
    except DeviceError:
        pass
    if free is not None and int(free) < (4 << 20):
        raise DeviceDiskFull(
            f"{device.spec.name}: the device's disk is full ({int(free) / 1e6:.1f} MB free); the partial upload was "
            "removed and the current version is untouched.",
            hint=f"Remove old versions and keep the current one: edgetk prune {name} --device {device.spec.name}, "
            "then re-run the deploy (or deploy --prune).",
        ) from None
    raise DeviceError(
        f"{exc.message} The partial upload was removed; the current version is untouched.", hint=exc.hint
    ) from None


# --------------------------------------------------------------------------------------------- the rest


def rollback(device: Device, name: str, *, break_lock: bool = False) -> dict[str, Any]:
    """``current`` back to the previous installed version, after verifying that version's files."""
    with DeviceLock(device, validate_name(name), what="rollback", break_lock=break_lock):
        return device.helper("rollback", validate_name(name))


def status(device: Device) -> dict[str, Any]:
    """``{"bundles": {name: {"current": version, "versions": [{"version", "installed_at", "by"}]}}}``."""
    return device.helper("status")


def remove(device: Device, name: str, *, break_lock: bool = False) -> dict[str, Any]:
    with DeviceLock(device, validate_name(name), what="remove", break_lock=break_lock):
        return device.helper("remove", validate_name(name))


def prune(device: Device, name: str, *, keep: int = 2, break_lock: bool = False) -> dict[str, Any]:
    """Remove old versions of ``name``: keep the current one and the ``keep - 1`` installed before it, always the
    rollback target (``{"current", "rollback_target", "removed", "kept", "freed_bytes"}``)."""
    with DeviceLock(device, validate_name(name), what="prune", break_lock=break_lock):
        return device.helper("prune", validate_name(name), str(int(keep)))


def _by(by: Any) -> str | None:
    return f"{by.get('host')} (pid {by.get('pid')})" if isinstance(by, dict) and by.get("host") else None


def installed_version(device: Device, name: str) -> str | None:
    entry = status(device).get("bundles", {}).get(name)
    return entry.get("current") if entry else None
