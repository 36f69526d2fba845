"""A device as the host sees it through the device helper (``toolkit/device_side/device_helper.py``, run with the
device's Python, its arguments passed as separate argv words, quoted for the remote shell by the connection):
the short program that runs the helper installed once per device, the frame its answer comes in, the names of a
bundle's folders there, and the steps that are one helper call each under the bundle's lock (rollback, status,
remove, prune). A push is :mod:`toolkit.delivery.push`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeVar

from toolkit import device_side
from toolkit.delivery.locks import DeviceLock
from toolkit.devices.connection import Connection
from toolkit.devices.spec import DEFAULT_HOME, DeviceSpec
from toolkit.errors import DeviceDiskFull, DeviceError, DeviceShellNoise, UsageError
from toolkit.model.answers import PruneAnswer, RemoveAnswer, RollbackAnswer, StatusAnswer
from toolkit.model.device_records import CommandResult
from toolkit.model.reading import RecordProblem, read_record
from toolkit.model.records import JsonDict
from toolkit.model.vocabulary import HelperRefusal

KEEP_VERSIONS = 3
HELPER_TIMEOUT_S = 120.0
BASE = DEFAULT_HOME  # the device's home for the toolkit unless its spec says another (DeviceSpec.base)
FRAME_BEGIN = "\x1eedgetk-json\n"  # the helper prints its JSON between these (a noisy process cannot break it)
FRAME_END = "\n\x1eedgetk-end\n"
ANSWERS_DOC = "docs/schemas/deploy.md"  # where the helper's answers are described
A = TypeVar("A")

# The ``-c`` program that runs the helper installed once per device at <home>/helper/<sha256>.py (the host
# installs it when this program answers "helper_missing"), from a compiled copy cached next to it when there is
# one (compiling the helper costs more than starting Python; a slow ARM board pays tens of milliseconds per
# call). The cache file is named by the source's sha256 and the device Python's bytecode tag and exact version,
# holds a CRC-32 of the code, is written atomically with mode 0644 and used only when it is the user's own and
# not writable by others; the installed source is compiled only when its sha256 is the expected one. Any cache
# problem falls back to compiling the source, so the cache can only save time. The command line stays ~1.5 KB
# whatever the helper's size. It passes the device's home (``~/.edgetk`` or the spec's ``home``) to the helper as
# $EDGETK_HOME, the one name every device-side program reads it by.
_BOOT = """import marshal, os, sys
os.environ["EDGETK_HOME"] = HOMEDIR
d = os.path.join(os.path.expanduser("~"), HOMEDIR, "helper")
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
def helper_source() -> str:
    return device_side.source_path(device_side.HELPER_FILE).read_text()


@lru_cache(maxsize=1)
def helper_digest() -> str:
    return hashlib.sha256(helper_source().encode()).hexdigest()


@lru_cache(maxsize=8)
def helper_boot(base: str = BASE) -> str:
    """The ``-c`` program that runs the installed helper from ``base`` (see ``_BOOT``)."""
    frame = {"FRAME_BEGIN": FRAME_BEGIN.encode("unicode_escape").decode(),
             "FRAME_END": FRAME_END.encode("unicode_escape").decode(),
             "HOMEDIR": json.dumps(base)}
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


def helper_json(stdout: str) -> JsonDict | None:
    """The helper's JSON answer (framed, or plain from an older helper), None when there is none."""
    text = unframe(stdout)
    if text is None:
        text = stdout  # an older helper on the device, or none: plain JSON
    try:
        data = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def refusal_of(data: JsonDict) -> HelperRefusal | None:
    """The ``kind`` of the helper's refusal ``data`` as a member, parsed here once (None: a kind this host does
    not know)."""
    kind = data.get("kind")
    return HelperRefusal(kind) if kind in HelperRefusal.values() else None


def refusal(result: CommandResult) -> HelperRefusal | None:
    """Why the helper run ``result`` refused (exit 3 and a JSON answer), None when it did not refuse."""
    data = helper_json(result.stdout)
    return refusal_of(data) if result.returncode == 3 and data is not None else None


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


def bundle_dir(name: str, *, base: str = BASE) -> str:
    """Where bundle ``name`` lives under the device's home for the toolkit ``base`` (``Device.base``)."""
    return f"{base}/bundles/{validate_name(name)}"


def version_dir(name: str, version: str, *, base: str = BASE) -> str:
    return f"{bundle_dir(name, base=base)}/{version}"


# --------------------------------------------------------------------------------------------- device calls


@dataclass
class Device:
    """A connection plus what we learned about the device; ``helper`` runs one helper command."""

    spec: DeviceSpec
    conn: Connection
    _info: JsonDict | None = field(default=None, repr=False)

    @property
    def helper_python(self) -> str:
        """The helper is stdlib-only: on ``local`` this very interpreter runs it (no PATH lookup, no shims)."""
        if self.spec.python:
            return self.spec.python
        return sys.executable if self.spec.is_local else "python3"

    @property
    def base(self) -> str:
        """The toolkit's directory on the device (``.edgetk`` under the home, or the spec's ``home``)."""
        return self.spec.base

    def install_helper(self) -> None:
        """Copy the helper to ``<home>/helper/<sha256>.py`` (atomically: a temp name, then a rename)."""
        helper_dir = f"{self.base}/helper"
        final = f"{helper_dir}/{helper_digest()[:32]}.py"
        temp = f"{final}.{uuid.uuid4().hex[:8]}.tmp"
        made = self.conn.run(["mkdir", "-p", helper_dir], timeout=HELPER_TIMEOUT_S)
        if not made.ok:
            raise DeviceError(f"{self.spec.name}: cannot create {helper_dir} on the device "
                              f"({made.stderr.strip()[-200:]}).", hint=home_hint(self.spec.name, made.stderr))
        self.conn.put(device_side.source_path(device_side.HELPER_FILE), temp)
        moved = self.conn.run(["mv", "-f", temp, final], timeout=HELPER_TIMEOUT_S)
        if not moved.ok:
            raise DeviceError(f"{self.spec.name}: cannot install the helper ({moved.stderr.strip()[-200:]}).")

    def helper_argv(self, command: str, *args: str) -> list[str]:
        # -S: the helper is stdlib-only, and site start-up (.pth files) costs tens of ms per call on a device
        return [self.helper_python, "-S", "-c", helper_boot(self.base), command, *args]

    def helper(self, command: str, *args: str, timeout: float = HELPER_TIMEOUT_S) -> JsonDict:
        result = self.conn.run(self.helper_argv(command, *args), timeout=timeout)
        if refusal(result) is HelperRefusal.HELPER_MISSING:
            self.install_helper()  # once per device and helper version
            result = self.conn.run(self.helper_argv(command, *args), timeout=timeout)
        return self.answer(command, result)

    def ask(self, kind: type[A], command: str, *args: str) -> A:
        """The helper's answer to ``command`` read as the record ``kind``, once, here: a malformed answer is one
        plain device error naming the key, not a KeyError somewhere after."""
        data = self.helper(command, *args)
        try:
            return read_record(kind, data, docs=ANSWERS_DOC)
        except RecordProblem as exc:
            where = f"[{exc.problem.table}]: " if exc.problem.table else ""
            raise DeviceError(f"{self.spec.name}: the device's answer to {command!r} does not read: "
                              f"{where}{exc.problem.message}",
                              hint="The helper on the device is the one this edgetk installs (by its sha256); "
                              "re-run with --debug and report the answer.") from None

    def answer(self, command: str, result: CommandResult) -> JsonDict:
        """The helper's JSON answer to ``command``, or the error its run says (a refusal, no Python, noise)."""
        data = helper_json(result.stdout)
        if result.returncode == 3 and isinstance(data, dict):
            kind = refusal_of(data)
            if kind in (HelperRefusal.NOT_INSTALLED, HelperRefusal.NO_PREVIOUS, HelperRefusal.USAGE):
                raise UsageError(
                    f"{self.spec.name}: {str(data.get('error')).rstrip('.')}.",
                    hint="See `edgetk status` for what is installed.",
                )
            refused = HelperDiskFull if kind is HelperRefusal.DISK_FULL else HelperRefused
            raise refused(self.spec.name, data, kind)
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

    def info(self) -> JsonDict:
        """The device's probe (the helper's ``info``), asked once per device and remembered."""
        if self._info is None:
            self._info = self.helper("info")
        return self._info

    def remember_info(self, info: JsonDict) -> None:
        """Keep ``info`` as this device's probe: one a push's begin already answered, reused by whatever follows
        on this device (check) instead of asking again."""
        self._info = info

    @property
    def python(self) -> str:
        """The Python that runs the runner: the spec's, else <home>/config.json's, else python3 on the device's
        PATH; on ``local``, the interpreter running edgetk (a venv install has its runtimes there, not in PATH's)."""
        return self.spec.python or self.info().get("config_python") or self.helper_python


def home_hint(device: str, error: str) -> str:
    """What to do when the toolkit's home on ``device`` cannot be written (``error``: what the device said)."""
    if "Read-only" in error or "read-only" in error or "Permission denied" in error:
        return (f"The device's home is not writable: run `edgetk devices probe --device {device}`, which finds a "
                'writable place, and set it as `home` in the inventory (or --device-home), e.g. "/data/edgetk".')
    return "Check the free disk and the home directory (`edgetk devices probe` looks at both)."


class HelperRefused(DeviceError):
    """The device-side helper refused a step; ``kind`` says which refusal (None: a kind this host does not know)."""

    fix = (
        "Read the device's refusal in the message; the hint names the step to take (a file with a wrong hash:"
        " re-run the deploy, it is sent again)."
    )

    def __init__(self, device: str, data: JsonDict, kind: HelperRefusal | None) -> None:
        self.kind = kind
        self.data = data
        message = f"{device}: {str(data.get('error')).rstrip('.')}."
        hints = {
            HelperRefusal.DISK_FULL: "Remove old versions and keep the current one: edgetk prune "
            f"{data.get('name') or 'NAME'} --device {device} (or re-run the deploy with --prune); `edgetk status` "
            "lists what is installed.",
            HelperRefusal.INTEGRITY: "Re-run the deploy: files with a wrong hash are sent again.",
        }
        super().__init__(message, hint=hints.get(kind) if kind is not None else None)


class HelperDiskFull(HelperRefused, DeviceDiskFull):
    """The helper's refusal ``disk_full``: what it needs is more than the device's disk has free."""

    fix = (
        "Free space on the device: `edgetk prune NAME --device SPEC` removes old versions (never the current "
        "one or the rollback target), or re-run the deploy with --prune."
    )


# --------------------------------------------------------------------------------------------- the steps


def rollback(device: Device, name: str, *, break_lock: bool = False) -> RollbackAnswer:
    """``current`` back to the previous installed version, after verifying that version's files."""
    with DeviceLock(device, validate_name(name), what="rollback", break_lock=break_lock):
        return device.ask(RollbackAnswer, "rollback", validate_name(name))


def status(device: Device) -> StatusAnswer:
    """Every bundle installed on the device: its current version, selection and installed versions."""
    return device.ask(StatusAnswer, "status")


def remove(device: Device, name: str, *, break_lock: bool = False) -> RemoveAnswer:
    with DeviceLock(device, validate_name(name), what="remove", break_lock=break_lock):
        return device.ask(RemoveAnswer, "remove", validate_name(name))


def prune(device: Device, name: str, *, keep: int = 2, break_lock: bool = False) -> PruneAnswer:
    """Remove old versions of ``name``: keep the current one and the ``keep - 1`` installed before it, always the
    rollback target."""
    with DeviceLock(device, validate_name(name), what="prune", break_lock=break_lock):
        return device.ask(PruneAnswer, "prune", validate_name(name), str(int(keep)))


def installed_version(device: Device, name: str) -> str | None:
    entry = status(device).bundles.get(name)
    return entry.current if entry else None

