"""The per-bundle lock on a device, seen from the host: who asks for it, whom a controller waits for, and what it
says about a lock it broke (the device side, ``acquire_lock`` in ``toolkit/device_side/device_helper.py``, decides).

A lock is ``~/.edgetk/locks/<name>/`` on the device with an owner record; what it holds and when it is broken:
``device_helper.py``'s header. ``--break-lock`` breaks it on request for the stuck case (a holder whose SSH
session lives on although its controller is gone).

Waiting: the first helper call waits at most ``FIRST_WAIT_S``; when the lock is held, the controller says at once
whom it waits for ("waiting for a deploy of NAME from HOST (pid N) ..."), then waits the rest of its timeout in
one more call. A refusal after the timeout names the holder and the way out.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TextIO, TypeVar

from toolkit.devices.spec import DeviceSpec
from toolkit.errors import DeviceError
from toolkit.model.answers import StatusAnswer
from toolkit.model.vocabulary import HelperRefusal


R = TypeVar("R")


class Device(Protocol):
    """What this module needs of ``toolkit.delivery.deployment.Device`` (imported by it, so not importable here)."""

    spec: DeviceSpec

    def helper(self, command: str, *args: str, timeout: float = ...) -> dict[str, Any]: ...  # Any: JSON

    def ask(self, kind: type[R], command: str, *args: str) -> R: ...


def _locked(exc: DeviceError) -> bool:
    """A helper refusal of kind ``locked`` (``toolkit.delivery.deployment.HelperRefused``: ``kind`` and ``data``)."""
    return getattr(exc, "kind", None) is HelperRefusal.LOCKED and isinstance(getattr(exc, "data", None), dict)

FIRST_WAIT_S = 1.0  # the first try's wait: long enough for a lock about to be released, short enough to tell
LOCK_TIMEOUT_S = 300.0


class LockHeld(DeviceError):
    """The bundle's lock on the device is held by a live holder (or one this device cannot check) past the
    timeout."""

    fix = (
        "Another controller is deploying this bundle to the device: wait for it (the message names the "
        "holder), or re-run with --break-lock if that holder is gone but its SSH session lives on."
    )


def request(what: str, *, version: str | None = None, break_lock: bool = False, prune: bool = False) -> str:
    """The JSON the helper records as the lock's owner (``by``, ``what``, ``version``) and acts on
    (``break``: --break-lock; ``prune``: deploy --prune)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    return json.dumps({"by": {"host": socket.gethostname(), "pid": os.getpid(), "user": user}, "what": what,
                       "version": version, "break": break_lock, "prune": prune})


def installer(by: object) -> str | None:
    """``HOST (pid N)`` from a ``by`` record (who installed a version or asked for a lock), None when unknown."""
    return f"{by.get('host')} (pid {by.get('pid')})" if isinstance(by, dict) and by.get("host") else None


def describe(owner: Any, name: str) -> str:  # Any: JSON
    """``a deploy of NAME (version 0123456789ab) from HOST (pid N)``, from an owner record."""
    owner = owner if isinstance(owner, dict) else {}
    what = owner.get("what") or "deploy"
    by = owner.get("by") if isinstance(owner.get("by"), dict) else None
    version = f" (version {str(owner['version'])[:12]})" if owner.get("version") else ""
    if by is None:
        holder = owner.get("holder") if isinstance(owner.get("holder"), dict) else {}
        process = f" (device process {holder['pid']})" if holder.get("pid") else ""
        return f"another {what} of {name}{version}{process}"
    who = f"{by.get('user')}@" if by.get("user") else ""
    return f"a {what} of {name}{version} from {who}{by.get('host') or 'an unknown host'} (pid {by.get('pid')})"


@dataclass(frozen=True)
class LockNote:
    """What taking the lock involved: how long this controller waited, for whom, and any lock it broke."""

    waited_s: float = 0.0
    waited_for: str | None = None
    broke: str | None = None

    @classmethod
    def from_answer(cls, answer: dict[str, Any], name: str, waited_for: str | None) -> LockNote:  # Any: JSON
        broke = answer.get("broke") if isinstance(answer.get("broke"), dict) else None
        owner = answer.get("waited_for")
        return cls(
            waited_s=float(answer.get("waited_s") or 0.0),
            waited_for=describe(owner, name) if owner else waited_for,
            broke=f"{describe(broke.get('owner'), name)}: {broke.get('why')}" if broke else None,
        )

    def lines(self) -> list[str]:
        out = []
        if self.broke:
            out.append(f"broke the lock of {self.broke}")
        if self.waited_for:
            out.append(f"waited {self.waited_s:.1f} s for {self.waited_for}")
        return out

    def to_dict(self) -> dict[str, object]:
        return {"waited_s": round(self.waited_s, 3), "waited_for": self.waited_for, "broke": self.broke}


def acquire(device: Device, name: str, call: Callable[[float], dict[str, Any]], *, timeout: float,
            stream: TextIO | None = None) -> tuple[dict[str, Any], LockNote]:  # Any: JSON
    """``call(wait_s)`` is one helper run that takes the lock (waiting up to ``wait_s`` on the device) and answers
    with ``{"lock": {...}}`` or the lock's own answer; a held lock is announced on ``stream`` and waited for."""
    first = min(timeout, FIRST_WAIT_S)
    announced = None
    try:
        answer = call(first)
    except DeviceError as refused:
        if not _locked(refused) or timeout <= first:
            raise _held(device, name, refused, timeout) if _locked(refused) else refused from None
        data: dict[str, Any] = getattr(refused, "data")  # Any: JSON
        announced = describe(data.get("owner"), name)
        held = data.get("held_s")
        since = f", which has held it for {held:.0f} s" if isinstance(held, (int, float)) else ""
        print(f"{device.spec.name}: waiting for {announced}{since} ...",
              file=stream if stream is not None else sys.stderr, flush=True)
        try:
            answer = call(timeout - first)
        except DeviceError as again:
            raise _held(device, name, again, timeout) if _locked(again) else again from None
    lock: dict[str, Any] = answer["lock"] if isinstance(answer.get("lock"), dict) else answer  # Any: JSON
    note = LockNote.from_answer(lock, name, announced)
    if announced and note.waited_s < first:  # the first try's wait counts too
        note = LockNote(note.waited_s + first, note.waited_for, note.broke)
    return answer, note


def _held(device: Device, name: str, refused: Any, timeout: float) -> LockHeld:  # Any: a refused DeviceError
    owner = refused.data.get("owner")
    held = refused.data.get("held_s")
    since = f" for {held:.0f} s" if isinstance(held, (int, float)) else ""
    if refused.data.get("alive"):
        state = "its holder still runs on the device"
        hint = ("Wait for it to finish. If that controller is gone but its SSH session lives on (a cut link the "
                "device has not noticed yet), re-run with --break-lock.")
    else:
        state = str(refused.data.get("why") or "its holder cannot be checked")
        hint = "If no such deploy is running any more, re-run with --break-lock."
    return LockHeld(f"{device.spec.name}: {describe(owner, name)} has held the lock{since}; gave up after "
                    f"{timeout:.0f} s ({state}).", hint=hint)


def replaced_note(device: Device, name: str, version: str) -> str | None:
    """When ``version`` of ``name`` is no longer current on the device (another controller deployed after this
    one switched it, while this command went on, e.g. checking): who replaced it with what."""
    entry = device.ask(StatusAnswer, "status").bundles.get(name)
    current = entry.current if entry is not None else None
    if current == version:
        return None
    by = next((v.by for v in entry.versions if v.version == current), None) if entry is not None else None
    named = installer(by.to_dict()) if by is not None else None
    who = f" from {named}" if named else ""
    now = f"by {str(current)[:12]}{who}" if current else "(it is no longer installed)"
    return f"{device.spec.name}: {name} {version[:12]} was replaced {now} before this command finished"


class DeviceLock:
    """The bundle's lock around a step that is one helper call of its own (rollback, remove, prune)."""

    def __init__(self, device: Device, name: str, *, what: str = "deploy", timeout: float = LOCK_TIMEOUT_S,
                 break_lock: bool = False, stream: TextIO | None = None) -> None:
        self.device = device
        self.name = name  # a bundle name the caller validated (toolkit.delivery.deployment.validate_name); the device
        # helper refuses any other
        self.what = what
        self.timeout = timeout
        self.break_lock = break_lock
        self.stream = stream
        self.token = uuid.uuid4().hex
        self.note = LockNote()

    def __enter__(self) -> DeviceLock:
        asked = request(self.what, break_lock=self.break_lock)
        _, self.note = acquire(
            self.device, self.name,
            lambda wait: self.device.helper("lock", self.name, str(wait), asked, self.token, timeout=wait + 60),
            timeout=self.timeout, stream=self.stream)
        return self

    def __exit__(self, *exc: object) -> None:
        release(self.device, self.name, self.token)


def release(device: Device, name: str, token: str) -> None:
    """Release the lock ``token`` took; on a dead link it cannot, but the lock's holder (that session) is gone
    then, and the next taker breaks it."""
    try:
        device.helper("unlock", name, token)
    except DeviceError:
        pass
