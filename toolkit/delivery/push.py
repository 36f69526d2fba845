"""Push a bundle to a device, install it atomically, roll back, list and remove (issue 5).

The host decides, the device does the file work: each step is one call of the device helper
(:mod:`toolkit.delivery.deployment`), a fresh Python on the device (tens of milliseconds each), so a push
makes exactly two, with the SFTP upload between them:

``begin``
  1. probes the device (arch, free disk; kept as ``Device.info()`` for the rest of the session) and refuses a
     bundle built for another arch (exit 2) unless ``force``, before anything is locked or written;
  2. takes the device-side lock ``~/.edgetk/locks/<name>`` (:mod:`toolkit.delivery.locks`), so two deploys
     of one bundle to one device run one after the other; any failure after this releases it before the helper
     exits;
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
     ``finally``). Most hashing is done by then (``begin``'s forked follower hashes each file as it arrives,
     trusted only while the file's stat is unchanged: ``device_helper.py``'s ``stat_key`` says its limit).

On a device where SFTP does not start (Dropbear without sftp-server), the whole push is ONE helper run on one
exec channel (``push``, :mod:`toolkit.delivery.deploy_stream`).

A failure on the host between the two releases the lock (``_Push`` says how, and why a dropped link need not).
The partial version stays for the next push to complete; ``current`` is switched only after every file is
verified, so the running version is never touched by a failed push.

The push's listing reuses the digests reading the bundle made (``toolkit.delivery.bundle.sha256_file``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TextIO

from toolkit.delivery import locks
from toolkit.delivery.bundle import Bundle
from toolkit.delivery.deploy_stream import Outgoing, StreamedPush, streaming
from toolkit.delivery.deploy_wire import UploadProgress, compress_files, resume_offsets
from toolkit.delivery.deployment import FRAME_END, HELPER_TIMEOUT_S, KEEP_VERSIONS, Device, HelperRefused, \
    validate_name, version_dir
from toolkit.delivery.locks import LOCK_TIMEOUT_S
from toolkit.devices.connection import Progress
from toolkit.errors import DeviceDiskFull, DeviceError, LinkDropped, UsageError
from toolkit.model.platform import accepted_arches
from toolkit.model.records import JsonDict, JsonObject
from toolkit.model.vocabulary import HelperRefusal

GZ_SUFFIX = ".edgetk-gz"  # the device helper's name for a compressed upload, inflated by its `inflate`


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
    route: str = ""  # how the files went: "ssh client (PATH)", "paramiko exec stream (why not the client)", ...

    def to_dict(self) -> JsonDict:
        fields_ = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "device"}
        return {**fields_, "seconds": round(self.seconds, 3), "removed": list(self.removed),
                "warnings": list(self.warnings), "lock": self.lock.to_dict(), "pruned": list(self.pruned)}


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
    job = _Push(device, bundle, name, force=force, keep=keep, break_lock=break_lock, prune=prune,
                progress_stream=progress_stream, compress=compress)
    with tempfile.TemporaryDirectory(prefix="edgetk-gz-") as packed_dir:
        job.packed_dir = Path(packed_dir)
        plan, lock = job.begin(lock_timeout)
        done, arch, sending, sent = job.transfer(plan)
    return PushResult(
        device=device.spec.name, name=name, version=bundle.version, arch=arch, files_total=len(job.sizes),
        files_sent=len(sending.missing), files_reused=len(plan.get("reused", [])), bytes_total=sum(job.sizes.values()),
        bytes_sent=sent, seconds=time.perf_counter() - started, previous=done.get("previous"),
        removed=tuple(done.get("removed", [])), bytes_resumed=sum(sending.offsets.values()),
        files_compressed=len(sending.packed),
        bytes_uncompressed=sum(job.sizes[m] - sending.offsets.get(m, 0) for m in sending.missing),
        warnings=tuple(sending.warnings), lock=lock, previous_by=locks.installer(done.get("previous_by")),
        pruned=tuple((plan.get("pruned") or {}).get("removed", [])),
        route=getattr(job.streams, "route", job.route),  # the ssh client's route says when it fell back
    )


@dataclass(frozen=True)
class _Sending:
    """What begin's plan leaves to send: the missing files, where cut-short ones resume, the compressed copies,
    the bytes each puts on the link."""

    missing: list[str]
    offsets: dict[str, int]
    packed: dict[str, Path]
    wire: dict[str, int]
    progress: UploadProgress
    warnings: list[str]


class _Push:
    """One push: the bundle's listing, the lock's request and token, what begin's plan leaves to send (worked out
    once), and who releases the lock: ``finish`` or ``abort`` on the device, else (any failure on the host)
    ``unlock``. A dropped link cannot: no reconnect just to unlock; the lock's holder (that session) is gone, and
    the next deploy breaks it."""

    def __init__(self, device: Device, bundle: Bundle, name: str, *, force: bool, keep: int, break_lock: bool,
                 prune: bool, progress_stream: TextIO | None, compress: bool) -> None:
        self.device, self.bundle, self.name, self.keep, self.compress = device, bundle, name, keep, compress
        self.progress_stream = progress_stream
        files = bundle.files()  # hashed once per process while unchanged (toolkit.delivery.bundle.sha256_file)
        self.listing = json.dumps([[f.path, f.sha256, f.bytes] for f in files])
        self.sizes = {f.path: f.bytes for f in files}
        self.digests = {f.path: f.sha256 for f in files}
        self.token = uuid.uuid4().hex
        self.arches = json.dumps([] if force else accepted_arches(bundle.manifest.target.arch))
        # no SFTP there, or a large bundle that the ssh client takes: begin, the files and finish go as one run on one
        # channel
        self.streams, self.route = streaming(device.conn, total=sum(self.sizes.values()))
        streams = self.streams
        self.asked = locks.request("deploy", version=bundle.version, break_lock=break_lock, prune=prune)
        self.runner_python = device.spec.python or (sys.executable if device.spec.is_local else "")
        self.streamed = None if streams is None else StreamedPush(
            device, streams, lambda wait: [*self.begin_args(wait), self.runner_python, str(keep)],
            reply_end=FRAME_END, plan=self.outgoing, timeout=HELPER_TIMEOUT_S)
        self.packed_dir = Path()  # where compressed copies go: the push's temporary folder
        self.sending: _Sending | None = None
        self.released = False  # the lock is the device's to release once finish or abort ran there

    def begin_args(self, wait: float) -> list[str]:
        """The arguments ``begin`` and the streamed ``push`` start with."""
        return [self.name, self.bundle.version, self.listing, str(wait), self.asked, self.token, self.arches]

    def begin(self, lock_timeout: float) -> tuple[JsonDict, locks.LockNote]:
        """Take the lock and begin's plan (the streamed push's first answer); a foreign arch refused by name."""
        device = self.device
        call: Callable[[float], JsonDict] = self.streamed.begin if self.streamed is not None else \
            lambda wait: device.helper("begin", *self.begin_args(wait), "0" if self.compress else "1",
                                       self.runner_python, timeout=wait + HELPER_TIMEOUT_S)
        try:
            # follow: the device hashes files sent as they are while they arrive (not compressed ones)
            return locks.acquire(device, self.name, call, timeout=lock_timeout, stream=self.progress_stream)
        except HelperRefused as refused:
            if refused.kind is HelperRefusal.ARCH:
                raise _arch_refused(self.bundle, device, str(refused.data.get("arch"))) from None
            raise

    def files(self, plan: JsonObject) -> _Sending:
        """What to send, from begin's plan (told once: the probe reused, the setup warnings printed)."""
        if self.sending is None:
            device = self.device
            info = plan.get("info")
            if isinstance(info, dict):
                device.remember_info(info)  # the probe of this push, reused by what follows on this device
            warnings = _setup_warnings(device, info if isinstance(info, dict) else {})
            for warning in warnings:
                print(f"warning: {warning}", flush=True,
                      file=self.progress_stream if self.progress_stream is not None else sys.stderr)
            missing = [str(m) for m in plan.get("missing", [])]
            offsets = resume_offsets(self.bundle, plan.get("partial") or {}, self.sizes)
            packed: dict[str, Path] = {}
            if self.compress and device.info().get("zlib", False):
                # a cut-short raw upload is resumed as it is; everything else may go compressed
                packed = compress_files(self.bundle, [m for m in missing if m not in offsets], self.packed_dir)
            wire = {m: packed[m].stat().st_size if m in packed else self.sizes[m] - offsets.get(m, 0)
                    for m in missing}
            self.sending = _Sending(missing, offsets, packed, wire, warnings=warnings, progress=UploadProgress(
                device.spec.name, sum(wire.values()), stream=self.progress_stream))
        return self.sending

    def outgoing(self, plan: JsonDict) -> tuple[list[Outgoing], Progress | None]:
        """The files of a streamed push, and its progress."""
        sending = self.files(plan)
        return [Outgoing(rel, sending.packed.get(rel, self.bundle.path / rel), sending.offsets.get(rel, 0),
                         rel in sending.packed, self.digests[rel], self.sizes[rel]) for rel in sending.missing], \
            sending.progress.file_progress(0)

    def transfer(self, plan: JsonDict) -> tuple[JsonObject, str, _Sending, int]:
        """The files to the device and finish there: (finish's answer, the device's arch, what was sent, the
        bytes that crossed the link)."""
        try:
            sending = self.files(plan)
            arch = str(self.device.info().get("arch"))  # begin's probe (files() keeps it)
            if self.streamed is not None:
                done = self._finished(self.streamed)  # received and finished in the same run as begin
                self.released, sent = True, sum(sending.wire.values())
            else:
                sent = self._upload(sending)
            sending.progress.done = sent
            sending.progress.finish()
            if self.streamed is None:
                self.released = True  # finish releases the lock in a finally, whatever it answers
                done = self.device.helper("finish", self.name, self.bundle.version, self.listing, str(self.keep),
                                          self.token, json.dumps(sorted(sending.packed)))
        except LinkDropped:
            raise
        except BaseException:
            if not self.released:
                locks.release(self.device, self.name, self.token)
            raise
        return done, arch, sending, sent

    def _finished(self, streamed: StreamedPush) -> JsonObject:
        try:
            return streamed.finished()
        except LinkDropped:
            raise
        except DeviceError as exc:
            self.released = True
            raise self._aborted(exc) from None

    def _upload(self, sending: _Sending) -> int:
        """Each missing file over the connection (SFTP, or exec channels); the bytes sent."""
        sent = 0
        vdir = version_dir(self.name, self.bundle.version, base=self.device.base)
        for rel in sending.missing:
            local, remote = (sending.packed[rel], f"{vdir}/{rel}{GZ_SUFFIX}") if rel in sending.packed else (
                self.bundle.path / rel, f"{vdir}/{rel}")
            try:
                self.device.conn.put(local, remote, progress=sending.progress.file_progress(sent),
                                     offset=sending.offsets.get(rel, 0))
            except LinkDropped:
                raise  # a dead link (or a device that stopped answering): no clean-up call can get through
            except DeviceError as exc:
                self.released = True  # abort releases the lock (or the link is gone and it goes stale)
                raise self._aborted(exc) from None
            sent += sending.wire[rel]
        return sent

    def _aborted(self, exc: DeviceError) -> DeviceError:
        """A write failed on a live link (typically a full disk): remove the partial version and release the lock
        (one helper call); the error that says why."""
        device, name = self.device, self.name
        free = None
        try:
            free = device.helper("abort", name, self.bundle.version, self.token).get("free_bytes")
        except LinkDropped:
            raise
        except DeviceError:
            pass
        if free is not None and int(free) < (4 << 20):
            return DeviceDiskFull(
                f"{device.spec.name}: the device's disk is full ({int(free) / 1e6:.1f} MB free); the partial upload "
                "was removed and the current version is untouched.",
                hint=f"Remove old versions and keep the current one: edgetk prune {name} --device "
                f"{device.spec.name}, then re-run the deploy (or deploy --prune).",
            )
        return DeviceError(f"{exc.message} The partial upload was removed; the current version is untouched.",
                           hint=exc.hint)


def _arch_refused(bundle: Bundle, device: Device, arch: str) -> UsageError:
    return UsageError(
        f"{device.spec.name}: the bundle {bundle.name!r} is built for {bundle.manifest.target.arch} "
        f"(target {bundle.manifest.target.name or 'unknown'}), but the device is {arch}.",
        hint="Convert for the device's target (edgetk convert --target ...), or pass --force to deploy anyway.",
    )



def _setup_warnings(device: Device, info: JsonDict) -> list[str]:
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
