"""The deploy lock, ``.edgetk/locks/<name>/`` (mkdir is atomic): taken with its owner record (the boot id, the
holder process from /proc, who asked), broken only when its holder is provably gone or on request, never by its age
(the header of device_helper.py says why); and ``begin``'s verified files, kept in the lock directory for ``finish``.
"""
import json
import os
import shutil
import time
from typing import Any, Dict, List, Optional, Tuple, Union  # noqa: F401 (type comments)
from device_probe import probe_read
from .answer import emit, fail
from .layout import BASE, bundle_dir, makedirs

# --- shipped from here (the lines above are for the host's type checker) ---

SHELLS = ("sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "fish", "busybox", "tcsh", "csh")


def proc_stat(pid):
    # type: (int) -> Optional[Tuple[str, int, str]]
    """(comm, ppid, starttime) of a process from /proc, or None when it does not exist (or no /proc)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            data = handle.read()
    except (OSError, IOError, ValueError):
        return None
    try:
        comm = data[data.index("(") + 1:data.rindex(")")]
        rest = data[data.rindex(")") + 2:].split()
        return comm, int(rest[1]), rest[19]
    except (ValueError, IndexError):
        return None


def lock_holder():
    # type: () -> Optional[Dict[str, Any]]
    """The process whose life is the deploy's: the first ancestor that is not a shell (the connection's sshd
    or dropbear process over SSH, edgetk itself on ``local``). Without /proc: our parent, start unknown."""
    if not os.path.isdir("/proc/self"):
        return {"pid": os.getppid(), "start": None}
    pid = os.getppid()
    for _ in range(6):
        stat = proc_stat(pid)
        if stat is None:
            return None
        comm, ppid, start = stat
        if comm in SHELLS and ppid > 1:
            pid = ppid
            continue
        return {"pid": pid, "start": start}
    return None


def boot_id():
    # type: () -> Optional[str]
    """This boot's id (/proc/sys/kernel/random/boot_id), or None where the kernel has none to give."""
    text = (probe_read("/proc/sys/kernel/random/boot_id") or "").strip()
    return text or None


def uptime_s():
    # type: () -> Optional[float]
    """Seconds since boot from /proc/uptime: a clock that NTP, a missing RTC or libfaketime cannot move."""
    try:
        return float((probe_read("/proc/uptime") or "").split()[0])
    except (ValueError, IndexError):
        return None


def holder_gone(owner):
    # type: (Optional[Dict[str, Any]]) -> Tuple[Optional[bool], str]
    """(gone, why) for a lock's recorded owner, told without wall clocks: True when its holder is provably gone
    (another boot, or the same boot and its process dead or reused), False while it lives, None when this device
    cannot tell (no holder recorded, no /proc and no signal answer): such a lock is never broken by itself.

    A device without a boot id: the holder is judged by its pid and start time alone; a reboot that gives a new
    process the same pid and start tick would keep the lock (until --break-lock), never break a live one."""
    holder = owner.get("holder") if isinstance(owner, dict) else None
    recorded, now = owner.get("boot_id") if isinstance(owner, dict) else None, boot_id()
    if recorded and now and recorded != now:
        return True, "the device rebooted since it was taken"
    if not isinstance(holder, dict) or not holder.get("pid"):
        return None, "its holder is not recorded"
    pid = int(holder["pid"])
    if os.path.isdir("/proc/self"):
        stat = proc_stat(pid)
        if stat is None:
            return True, "its holder (process %d) is gone" % pid
        if holder.get("start") is not None and stat[2] != holder.get("start"):
            return True, "its holder (process %d) is gone (the pid belongs to another process now)" % pid
        return False, "its holder (process %d) is running" % pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True, "its holder (process %d) is gone" % pid
    except OSError:
        pass  # EPERM: a process of another user has that pid: alive, as far as we can tell
    return None, "process %d exists, and without /proc this device cannot tell whether it is the holder" % pid


OWNERLESS_S = 30.0  # a lock directory with no owner record for this long (its taker died at once) is broken


def read_request(request):
    # type: (Optional[str]) -> Dict[str, Any]
    """The host's lock request (JSON): {"break": bool, "by": {"host", "pid", "user"}, "what", "version"}."""
    try:
        data = json.loads(request) if request else {}
    except ValueError:
        data = {}
    return data if isinstance(data, dict) else {}


def held_for(owner):
    # type: (Optional[Dict[str, Any]]) -> Optional[float]
    """Seconds the lock has been held, from /proc/uptime (same boot only), else None: never the wall clock."""
    now = uptime_s()
    if not isinstance(owner, dict) or now is None or owner.get("uptime") is None or owner.get("boot_id") != boot_id():
        return None
    return round(max(0.0, now - float(owner["uptime"])), 1)


def break_lock(path, token, judged=None, check=True):
    # type: (str, str, Optional[Dict[str, Any]], bool) -> bool
    """Move the lock away (atomic: one rename, so two breakers cannot both win) and delete it. With ``check``,
    only the lock that was judged (its owner record ``judged``, None for one without a record): when another
    taker replaced it since it was read, it is put back and nothing is broken."""
    stale_path = "%s.broken.%s" % (path, token)
    try:
        os.rename(path, stale_path)
    except OSError:
        return False
    if check:
        try:
            with open(os.path.join(stale_path, "owner.json")) as handle:
                found = json.load(handle)
        except (OSError, ValueError):
            found = None
        found = found if isinstance(found, dict) else {}
        if found.get("token") != (judged or {}).get("token"):
            try:
                os.rename(stale_path, path)  # a fresh lock, not the one judged: put it back
                return False
            except OSError:
                pass
    shutil.rmtree(stale_path, ignore_errors=True)
    return True


def acquire_lock(name, timeout, request, token):
    # type: (str, Union[str, float], Optional[str], str) -> Dict[str, Any]
    """Take ``.edgetk/locks/<name>`` (atomic mkdir), waiting up to ``timeout`` seconds for its holder.

    A lock is broken only when its holder is provably gone (``holder_gone``), or on request (``--break-lock``),
    never by its age: a device clock that jumps (no RTC, NTP syncing after boot) cannot make a live lock look
    old. The waiting is timed with ``time.monotonic`` of this process, which a clock jump does not move. The
    refusal after ``timeout`` names the holder (``owner``) so that the host can say whom it waits for."""
    bundle_dir(name)  # validates the name
    asked = read_request(request)
    locks = os.path.join(BASE, "locks")
    makedirs(locks)
    path = os.path.join(locks, name)
    started = time.monotonic()
    broke, waited_for, ownerless_since = None, None, None
    while True:
        if asked.get("break") and broke is None and os.path.isdir(path):
            owner = lock_owner(name)
            if break_lock(path, token, check=False):
                broke = {"owner": owner, "why": "broken on request (--break-lock)"}
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            owner = lock_owner(name)
            if owner is None:
                now = time.monotonic()
                ownerless_since = now if ownerless_since is None else ownerless_since
                gone, why = (True, "no owner was recorded in %.0f s" % OWNERLESS_S) \
                    if now - ownerless_since > OWNERLESS_S else (None, "no owner recorded yet")
            else:
                ownerless_since = None
                gone, why = holder_gone(owner)
                waited_for = owner if not gone else waited_for
            if gone and break_lock(path, token, owner):
                broke = {"owner": owner, "why": why}
                continue
            if time.monotonic() - started >= float(timeout):
                fail("locked", "another %s of %r holds the lock (%s)" % ((owner or {}).get("what") or "deploy", name,
                                                                         why),
                     owner=owner, held_s=held_for(owner), alive=gone is False, why=why)
            time.sleep(0.1)
            continue
        record = {"token": token, "pid": os.getpid(), "host": os.uname()[1], "time": time.time(),
                  "boot_id": boot_id(), "uptime": uptime_s(), "holder": lock_holder(), "by": asked.get("by"),
                  "what": asked.get("what") or "deploy", "version": asked.get("version")}
        tmp = os.path.join(path, "owner.json.tmp")
        with open(tmp, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, os.path.join(path, "owner.json"))  # readers see a whole record or none
        return {"acquired": True, "waited_s": round(time.monotonic() - started, 3), "broke": broke,
                "waited_for": waited_for}


def lock_owner(name):
    # type: (str) -> Optional[Dict[str, Any]]
    try:
        with open(os.path.join(BASE, "locks", name, "owner.json")) as handle:
            owner = json.load(handle)
        return owner if isinstance(owner, dict) else None
    except (OSError, ValueError):
        return None


def release_lock(name, token):
    # type: (str, str) -> bool
    bundle_dir(name)
    owner = lock_owner(name)
    if owner is None or owner.get("token") != token:
        return False
    shutil.rmtree(os.path.join(BASE, "locks", name), ignore_errors=True)
    return True


def cmd_lock(name, timeout, request, token):
    # type: (str, str, str, str) -> None
    emit(acquire_lock(name, timeout, request, token))


def cmd_unlock(name, token):
    # type: (str, str) -> None
    emit({"released": release_lock(name, token)})


def save_verified(name, token, version, verified):
    # type: (str, str, str, Dict[str, List[int]]) -> None
    """``begin``'s verified files, kept in the lock directory (ours while we hold it) for ``finish``."""
    path = os.path.join(BASE, "locks", name, "verified.json")
    with open(path, "w") as handle:
        json.dump({"token": token, "version": version, "files": verified}, handle)


def load_verified(name, token, version):
    # type: (str, str, str) -> Dict[str, List[int]]
    """What ``save_verified`` kept, when the lock is still ours; else nothing (everything is hashed again)."""
    owner = lock_owner(name)
    if owner is None or owner.get("token") != token:
        return {}
    try:
        with open(os.path.join(BASE, "locks", name, "verified.json")) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("token") != token or data.get("version") != version:
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}
