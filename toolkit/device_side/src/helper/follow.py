"""The follower: a child ``begin`` forks to hash the uploads while they arrive, so that ``finish`` need not read
them again; its answers (a digest and a stat per file) kept in the lock directory, trusted only while the lock is
the push's own.
"""
import json
import os
import time
from typing import Any, Dict, List  # noqa: F401 (type comments)
from .layout import BASE, bundle_dir
from .locks import lock_owner, proc_stat

# --- shipped from here (the lines above are for the host's type checker) ---

FOLLOW_IDLE_S = 30.0  # a follower whose upload makes no progress for this long gives up (finish hashes)


FOLLOW_WAIT_S = 10.0  # how long finish waits for a follower that is still hashing


def start_follower(name, version, token, fresh):
    # type: (str, str, str, List[List[Any]]) -> None
    """Fork the follower; the parent goes on at once (the child lets go of stdout, so the call returns)."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_r)
        child = proc_stat(pid)
        try:  # recorded before the child writes anything, so that finish knows whom to wait for
            save_follow(name, token, version, {"pid": pid, "start": child[2] if child else None, "done": False,
                                               "files": {}})
        finally:
            os.close(ready_w)  # the child starts
        return
    code = 0
    try:
        os.close(ready_w)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.read(ready_r, 1)  # EOF once the parent has recorded us
        os.close(ready_r)
        follow(name, version, token, fresh)
    except BaseException:  # the follower is an optimisation: whatever happens, finish hashes instead
        code = 1
    os._exit(code)


def follow(name, version, token, fresh):
    # type: (str, str, str, List[List[Any]]) -> None
    """Hash each file the host sends afresh while it arrives, so that finish need not read it again.

    Each such file is new (prepare removed any leftover; a cut-short one that the host may resume is not
    followed), and the upload writes it front to back, once: a byte below the file's size is final when read.
    The answer per file is its sha256 and its stat when the last byte was read; ``finish`` trusts it only when
    the digest is the expected one and the stat is still the same (otherwise it hashes the file itself). The
    follower stops when the lock is no longer this push's (finish, abort, a broken lock) or the upload stalls.
    """
    vdir = os.path.join(bundle_dir(name), version)
    me = proc_stat(os.getpid())
    state = {"pid": os.getpid(), "start": me[2] if me else None, "done": False, "files": {}}  # type: Dict[str, Any]
    checked = time.time()
    for rel, size in fresh:
        path = os.path.join(vdir, rel)
        import hashlib

        digest = hashlib.sha256()
        handle, pos, progress = None, 0, time.time()  # type: Any, int, float  # Any: open once the loop ends
        while True:
            if handle is None:
                try:
                    handle = open(path, "rb", buffering=0)
                except (OSError, IOError):
                    handle = None
            block = handle.read(1 << 20) if handle is not None else b""
            if block:
                digest.update(block)
                pos += len(block)
                progress = time.time()
                if pos >= size:
                    break
                continue
            now = time.time()
            if now - progress > FOLLOW_IDLE_S:
                return
            if now - checked > 0.25:
                checked = now
                owner = lock_owner(name)
                if owner is None or owner.get("token") != token:
                    return
            time.sleep(0.003)
        st = os.fstat(handle.fileno())
        handle.close()
        if pos == size:
            state["files"][rel] = [digest.hexdigest(), [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                                        st.st_ctime_ns]]
            save_follow(name, token, version, state)
    state["done"] = True
    save_follow(name, token, version, state)


def save_follow(name, token, version, state):
    # type: (str, str, str, Dict[str, Any]) -> None
    owner = lock_owner(name)
    if owner is None or owner.get("token") != token:
        return
    path = os.path.join(BASE, "locks", name, "follow.json")
    tmp = path + ".tmp.%d" % os.getpid()
    data = dict(state)
    data.update({"token": token, "version": version})
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def load_follow(name, token, version):
    # type: (str, str, str) -> Dict[str, Any]
    """The follower's hashes for this push, waiting (briefly) for a follower that is still at work."""
    deadline = time.time() + FOLLOW_WAIT_S
    while True:
        try:
            with open(os.path.join(BASE, "locks", name, "follow.json")) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("token") != token or data.get("version") != version:
            return {}
        files = data["files"] if isinstance(data.get("files"), dict) else {}
        if data.get("done") or time.time() > deadline:
            return files
        stat = proc_stat(int(data.get("pid") or 0))
        if stat is None or stat[2] != data.get("start"):
            return files  # the follower is gone: what it finished still counts
        time.sleep(0.003)
