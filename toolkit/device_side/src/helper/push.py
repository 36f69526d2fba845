"""A push in as few runs as it can: ``begin`` (refuse a foreign arch, probe, lock, prepare, start the follower),
``receive`` (the files as one framed stream on stdin, hashed as they arrive, then ``finish`` in the same run) and
``push`` (both in one run and one channel).
"""
import json
import os
import sys
from typing import Any, BinaryIO, Dict  # noqa: F401 (type comments)
from .answer import emit, fail, reply
from .layout import bundle_dir, check_inside, check_version, safe_rel
from .locks import acquire_lock, lock_owner, read_request, release_lock, save_verified
from .device import device_info, finish_numpy_check, start_numpy_check
from .follow import save_follow, start_follower
from .install import cmd_finish, prepare

# --- shipped from here (the lines above are for the host's type checker) ---

def cmd_begin(name, version, files_json, timeout, request, token, arches_json="[]", follow="0", runner_python=""):
    # type: (str, str, str, str, str, str, str, str, str) -> None
    emit(begin(name, version, files_json, timeout, request, token, arches_json, follow, runner_python))


def cmd_push(name, version, files_json, timeout, request, token, arches_json, runner_python, keep):
    # type: (str, str, str, str, str, str, str, str, str) -> None
    """A whole streamed push in one run and one channel: ``begin`` (its plan answered at once on stdout), then
    ``receive`` of the missing files the host sends on stdin after reading that plan, then ``finish``. A
    refusal of ``begin`` (a held lock, a foreign arch) ends the run before any file is read."""
    reply(begin(name, version, files_json, timeout, request, token, arches_json, "0", runner_python))
    cmd_receive(name, version, token, files_json, keep)


def begin(name, version, files_json, timeout, request, token, arches_json="[]", follow="0", runner_python=""):
    # type: (str, str, str, str, str, str, str, str, str) -> Dict[str, Any]
    """The first half of a push in one run: refuse a foreign arch, probe, lock, prepare.

    ``arches_json`` lists the ``uname -m`` names the bundle's target accepts (empty: any, ``--force``); a
    mismatch is refused before anything is locked or written. Once the lock is taken, any failure releases it
    before this process exits. With ``follow`` = "1" (the host sends the files as they are, no compression),
    a forked child hashes the uploads while they arrive (see ``follow``).
    """
    check_version(version)
    files = json.loads(files_json)
    info = device_info()
    arches = json.loads(arches_json)
    if arches and info["arch"].strip().lower() not in arches:
        fail("arch", "the device is %s" % info["arch"], arch=info["arch"])
    numpy_check = start_numpy_check(runner_python)
    lock = acquire_lock(name, timeout, request, token)
    try:
        plan = prepare(name, version, files, prune=read_request(request).get("prune"))
        save_verified(name, token, version, plan.pop("verified"))
        sizes = dict((rel, size) for rel, _, size in files)
        fresh = [[rel, sizes[rel]] for rel in plan["missing"] if rel not in plan["partial"]]
        if follow == "1" and fresh and hasattr(os, "fork"):
            start_follower(name, version, token, fresh)
    except BaseException:  # a refusal (SystemExit from fail), a full disk, anything: the lock goes with us
        release_lock(name, token)
        raise
    info.update(finish_numpy_check(numpy_check))
    plan.update({"info": info, "lock": lock})
    return plan


PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged pipe (/proc/sys/fs/pipe-max-size)


def widen_pipe(stream):
    # type: (BinaryIO) -> None
    """Let the SSH server queue up to ``PIPE_BYTES`` of the stream in our stdin pipe (Linux: 64 KiB by default)
    while we hash and write a block: it writes each packet at once and returns its window to the host, instead of
    stalling the link until we read again. Not a pipe, not Linux, over the limit: left as it is."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, OSError, ValueError):
        pass


def cmd_receive(name, version, token, files_json="", keep=""):
    # type: (str, str, str, str, str) -> None
    """The files of a push on ONE channel: a framed stream on stdin, written, hashed as they arrive, checked.

    Each frame is a JSON header line ``[rel, offset, length, packed, sha256, size]`` and ``length`` bytes: the
    file from ``offset`` on (a cut-short upload is resumed where it stopped, its prefix hashed from disk), gzip
    data when ``packed`` (inflated as it arrives). ``[]`` ends the stream. A file whose sha256 or size is not the
    expected one is removed and refused (``integrity``); the others' digests and stats go where ``finish`` reads
    the follower's, so ``finish`` hashes nothing again. A stream cut short leaves the file being written in
    place, for the next push to resume. Only the push holding the lock ``token`` may write. With the push's
    listing ``files_json`` and ``keep``, ``finish`` runs right after, in this same run (one Python less)."""
    import hashlib

    vdir = os.path.join(bundle_dir(name), check_version(version))
    owner = lock_owner(name)
    if owner is None or owner.get("token") != token:
        fail("locked", "this push no longer holds the lock of %r (it was broken)" % name)
    stdin = sys.stdin.buffer
    widen_pipe(stdin)
    received, bad = {}, []
    while True:
        line = stdin.readline()
        if not line.endswith(b"\n"):
            fail("cut", "the stream of files ended early")
        head = json.loads(line.decode("utf-8"))
        if not head:
            break
        rel, offset, length, packed, digest, size = head
        path = os.path.join(vdir, safe_rel(rel))
        check_inside(vdir, path)
        hasher = hashlib.sha256()
        if offset:
            with open(path, "rb") as handle:
                left = offset
                while left:
                    block = handle.read(min(left, 1 << 20))
                    if not block:
                        fail("usage", "cannot resume %s at %d: the file is shorter" % (rel, offset))
                    hasher.update(block)
                    left -= len(block)
            out = open(path, "r+b")  # type: BinaryIO
            out.seek(offset)
            out.truncate()
        else:
            out = open(path, "wb")
        inflater = None
        if packed:
            import zlib

            inflater = zlib.decompressobj(31)
        with out:
            left = length
            while left:
                block = stdin.read(min(left, 1 << 20))
                if not block:
                    fail("cut", "the stream of files ended early (in %s)" % rel)
                left -= len(block)
                if inflater is not None:
                    block = inflater.decompress(block)
                out.write(block)
                hasher.update(block)
            if inflater is not None:
                block = inflater.flush()
                out.write(block)
                hasher.update(block)
            out.flush()
            st = os.fstat(out.fileno())
        if hasher.hexdigest() != digest or st.st_size != size:
            os.remove(path)
            bad.append(rel)
            continue
        received[rel] = [digest, [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]]
    save_follow(name, token, version, {"pid": os.getpid(), "start": None, "done": True, "files": received})
    if bad:
        fail("integrity", "files do not match their sha256 on arrival: " + ", ".join(bad), bad=bad)
    if files_json:
        cmd_finish(name, version, files_json, keep, token)
    emit({"received": sorted(received)})
