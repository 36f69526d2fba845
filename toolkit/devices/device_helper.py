# mypy: ignore-errors
"""The device side of deploy: run as ``python -c <this file's text> SUBCOMMAND ARGS...`` on the device.

Python >= 3.6, stdlib only (it must work on a device with no numpy and on Jetson's Python 3.6). Arguments
arrive as separate argv words (the host quotes each one), so names are data, never shell. Every path is
relative to the home directory (the working directory of SSH sessions and of ``local``). It prints one JSON
object; exit 0 = done, 3 = a refusal the host turns into a plain message ({"kind", "error", ...}).

Layout: ``.edgetk/bundles/<name>/<version>/`` (files mirror the bundle), ``.edgetk/bundles/<name>/current`` ->
``<version>`` (switched with rename(2) over a fresh symlink: atomic), ``.edgetk/bundles/<name>/.history.json``
(installed versions, oldest first, with every file's sha256, so rollback can verify what it switches to),
``.edgetk/locks/<name>/`` (mkdir is atomic: the deploy lock). The lock records its holder: the first
non-shell ancestor of the helper (the per-connection sshd process over SSH, the edgetk process on ``local``)
with its start time; a lock whose holder is gone (a deploy whose link was cut, or that was killed) is broken at
once instead of after ``stale`` seconds, so a re-run after a link cut does not wait for it.

Every bundle-relative path from the host is checked again here (no absolute paths, no ``..``, no symlinked
directories on the way), so even a hand-crafted listing cannot write outside ``.edgetk/bundles/<name>/``.
"""
import hashlib
import json
import os
import platform
import shutil
import socket
import sys
import time

BASE = ".edgetk"
GZ_SUFFIX = ".edgetk-gz"  # a file sent gzip-compressed (deploy --compress), inflated by `inflate`
SHELLS = ("sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "fish", "busybox", "tcsh", "csh")


def emit(obj, code=0):
    sys.stdout.write(json.dumps(obj))
    sys.stdout.flush()
    sys.exit(code)


def fail(kind, message, **extra):
    extra.update({"kind": kind, "error": message})
    emit(extra, 3)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(1 << 20)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def bundle_dir(name):
    if not name or name in (".", "..") or "/" in name or name.startswith((".", "-")) or "\x00" in name:
        fail("usage", "refusing the bundle name %r" % (name,))
    return os.path.join(BASE, "bundles", name)


def safe_rel(rel):
    """A path inside a version directory: relative, no '..', no empty or '.' parts."""
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or rel.startswith("/") or "\\" in rel or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
        fail("usage", "refusing the bundle path %r: it would leave the bundle directory" % (rel,))
    return rel


def check_inside(root, path):
    """``path`` (under ``root``) must not reach outside it through a symlinked directory."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.dirname(path))
    if real != real_root and not real.startswith(real_root + os.sep):
        fail("usage", "refusing %s: a directory on the way is a link out of the bundle" % path)


def check_version(version):
    if not version or len(version) > 128 or any(c not in "0123456789abcdef" for c in version):
        fail("usage", "refusing the version %r: a version is a sha256 in hex" % (version,))
    return version


def proc_stat(pid):
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
    """The process whose life is the deploy's: the first ancestor that is not a shell."""
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


def holder_alive(owner):
    holder = owner.get("holder") if isinstance(owner, dict) else None
    if not isinstance(holder, dict) or not os.path.isdir("/proc/self"):
        return None  # unknown: fall back to the lock's age
    stat = proc_stat(int(holder.get("pid", 0)))
    return stat is not None and stat[2] == holder.get("start")


def makedirs(path):
    if not os.path.isdir(path):
        os.makedirs(path, 0o755)


def free_bytes(path="."):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def read_current(name):
    link = os.path.join(bundle_dir(name), "current")
    if os.path.islink(link):
        return os.readlink(link).rstrip("/")
    return None


def load_history(name):
    path = os.path.join(bundle_dir(name), ".history.json")
    try:
        with open(path) as handle:
            data = json.load(handle)
        return data if isinstance(data, list) else []
    except (OSError, ValueError):
        return []


def save_history(name, history):
    path = os.path.join(bundle_dir(name), ".history.json")
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as handle:
        json.dump(history, handle)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def file_ok(path, digest):
    return os.path.isfile(path) and not os.path.islink(path) and sha256(path) == digest


def switch_current(name, version):
    bdir = bundle_dir(name)
    tmp = os.path.join(bdir, ".current.tmp.%d" % os.getpid())
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(version, tmp)
    os.replace(tmp, os.path.join(bdir, "current"))


def verify(vdir, files):
    bad = []
    for rel, digest in files.items():
        path = os.path.join(vdir, rel)
        if not os.path.isfile(path):
            bad.append(rel + " (missing)")
        elif os.path.islink(path) or sha256(path) != digest:
            bad.append(rel + " (sha256 mismatch)")
    return bad


def tidy_permissions(path):
    for root, dirs, names in os.walk(path):
        os.chmod(root, 0o755)
        for name in names:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                os.chmod(full, 0o644)


def read_config_python():
    try:
        with open(os.path.join(BASE, "config.json")) as handle:
            value = json.load(handle).get("python")
        return value if isinstance(value, str) and value else None
    except (OSError, ValueError, AttributeError):
        return None


def cmd_info():
    home = os.path.expanduser("~")
    emit({
        "arch": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "home": home,
        # where bundles go: ~/.edgetk may be its own filesystem (an SD card's data partition)
        "free_bytes": free_bytes(BASE if os.path.isdir(BASE) else home),
        "config_python": read_config_python(),
        "zlib": zlib_available(),
    })


def zlib_available():
    try:
        import zlib  # noqa: F401  (a Python built without zlib cannot inflate: deploy then sends files as they are)
    except ImportError:
        return False
    return True


def cmd_inflate(name, version, files_json):
    """Decompress the gzip uploads ``<rel>.edgetk-gz`` of a version into ``<rel>`` and remove them.

    The host sends a file compressed when that pays (deploy --compress). Each is inflated to a temporary file
    and renamed over ``<rel>``; ``finish`` then verifies the sha256 of the decompressed file exactly as for a
    file sent as it is, so a corrupt or truncated upload is refused there (or here, when gzip cannot read it).
    """
    import zlib

    vdir = os.path.join(bundle_dir(name), check_version(version))
    done = []
    for rel in json.loads(files_json):
        path = os.path.join(vdir, safe_rel(rel))
        check_inside(vdir, path)
        packed = path + GZ_SUFFIX
        tmp = path + ".inflate.%d" % os.getpid()
        try:
            with open(packed, "rb") as src, open(tmp, "wb") as dst:
                inflater = zlib.decompressobj(31)
                while True:
                    block = src.read(1 << 20)
                    if not block:
                        break
                    dst.write(inflater.decompress(block))
                dst.write(inflater.flush())
                if not inflater.eof:
                    raise zlib.error("the compressed upload is truncated")
            os.replace(tmp, path)
        except zlib.error as exc:
            for leftover in (tmp, packed):
                if os.path.exists(leftover):
                    os.remove(leftover)
            fail("integrity", "the compressed upload of %s is damaged (%s)" % (rel, exc), bad=[rel])
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        os.remove(packed)
        done.append(rel)
    emit({"inflated": done})


def cmd_prepare(name, version, files_json):
    """Create the version dir; reuse files already there or in another version; list what must be sent."""
    files = json.loads(files_json)  # [[rel, sha256, bytes], ...]
    bdir = bundle_dir(name)
    vdir = os.path.join(bdir, check_version(version))
    for rel, _, _ in files:
        safe_rel(rel)
    makedirs(vdir)
    others = [os.path.join(bdir, v) for v in sorted(os.listdir(bdir))
              if v != version and not v.startswith(".") and v != "current" and os.path.isdir(os.path.join(bdir, v))]
    missing, reused, present, need, partial = [], [], 0, 0, {}
    for rel, digest, size in files:
        path = os.path.join(vdir, rel)
        check_inside(vdir, path)
        makedirs(os.path.dirname(path))
        check_inside(vdir, path)
        if os.path.islink(path):
            os.remove(path)
        if file_ok(path, digest):
            present += 1
            continue
        source = None
        for other in others:
            candidate = os.path.join(other, rel)
            if os.path.isfile(candidate) and os.path.getsize(candidate) == size and file_ok(candidate, digest):
                source = candidate
                break
        if source is not None:
            if os.path.lexists(path):
                os.remove(path)
            try:
                os.link(source, path)
            except OSError:
                shutil.copyfile(source, path)
            reused.append(rel)
            continue
        missing.append(rel)
        have = os.path.getsize(path) if os.path.isfile(path) else 0
        if 0 < have < size:
            # an upload cut short: the host resumes it if these bytes are a prefix of its file
            partial[rel] = [have, sha256(path)]
            need += size - have
        else:
            need += size
    free = free_bytes(vdir)
    if need + (1 << 20) > free:
        abort(name, version)
        fail("disk_full", "needs %.1f MB free for the bundle, the device has %.1f MB" % (need / 1e6, free / 1e6),
             need_bytes=need, free_bytes=free)
    emit({"missing": missing, "reused": reused, "present": present, "free_bytes": free, "partial": partial})


def abort(name, version):
    """Remove a version that was never installed (a failed push); never the current or an installed one."""
    if read_current(name) == version or any(h.get("version") == version for h in load_history(name)):
        return False
    shutil.rmtree(os.path.join(bundle_dir(name), version), ignore_errors=True)
    bdir = bundle_dir(name)
    if os.path.isdir(bdir) and not [e for e in os.listdir(bdir) if not e.startswith(".")]:
        shutil.rmtree(bdir, ignore_errors=True)
    return True


def cmd_abort(name, version):
    check_version(version)
    emit({"removed": abort(name, version)})


def cmd_finish(name, version, files_json, keep):
    files = dict((safe_rel(rel), digest) for rel, digest, _ in json.loads(files_json))
    keep = max(1, int(keep))
    bdir = bundle_dir(name)
    vdir = os.path.join(bdir, check_version(version))
    for root, _dirs, names in os.walk(vdir):
        for leftover in names:
            if leftover.endswith(GZ_SUFFIX):  # a compressed upload cut short by an earlier push
                os.remove(os.path.join(root, leftover))
    bad = verify(vdir, files)
    if bad:
        fail("integrity", "files do not match their sha256 after the upload: " + ", ".join(bad), bad=bad)
    tidy_permissions(vdir)
    previous = read_current(name)
    switch_current(name, version)
    history = [h for h in load_history(name) if h.get("version") != version]
    history.append({"version": version, "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "files": files})
    dropped, history = history[:-keep], history[-keep:]
    save_history(name, history)
    kept = set(h["version"] for h in history)
    removed = []
    for entry in os.listdir(bdir):
        full = os.path.join(bdir, entry)
        if entry.startswith(".") or entry == "current" or entry in kept or not os.path.isdir(full):
            continue
        shutil.rmtree(full, ignore_errors=True)
        removed.append(entry)
    for path in (BASE, os.path.join(BASE, "bundles"), bdir):
        os.chmod(path, 0o755)
    emit({"current": version, "previous": previous, "removed": removed, "dropped": [h["version"] for h in dropped]})


def cmd_rollback(name):
    bdir = bundle_dir(name)
    if not os.path.isdir(bdir):
        fail("not_installed", "the bundle %r is not installed" % name)
    current = read_current(name)
    history = load_history(name)
    versions = [h["version"] for h in history]
    if current not in versions or versions.index(current) == 0:
        fail("no_previous", "there is no version before %s to roll back to" % (current or "none")[:12])
    entry = history[versions.index(current) - 1]
    bad = verify(os.path.join(bdir, entry["version"]), entry.get("files", {}))
    if bad:
        fail("integrity", "the previous version is damaged: " + ", ".join(bad), bad=bad)
    switch_current(name, entry["version"])
    emit({"current": entry["version"], "previous": current})


def cmd_status():
    root = os.path.join(BASE, "bundles")
    out = {}
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            if name.startswith(".") or not os.path.isdir(os.path.join(root, name)):
                continue
            history = load_history(name)
            out[name] = {
                "current": read_current(name),
                "versions": [{"version": h.get("version"), "installed_at": h.get("installed_at")} for h in history],
            }
    emit({"bundles": out})


def cmd_remove(name):
    bdir = bundle_dir(name)
    if not os.path.isdir(bdir):
        fail("not_installed", "the bundle %r is not installed" % name)
    shutil.rmtree(bdir)
    emit({"removed": name})


def cmd_lock(name, timeout, stale, token):
    bundle_dir(name)  # validates the name
    locks = os.path.join(BASE, "locks")
    makedirs(locks)
    path = os.path.join(locks, name)
    started = time.time()
    broke = None
    while True:
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            try:
                age = time.time() - os.stat(path).st_mtime
            except OSError:
                continue
            owner = None
            try:
                with open(os.path.join(path, "owner.json")) as handle:
                    owner = json.load(handle)
            except (OSError, ValueError):
                pass
            if holder_alive(owner) is False or age > float(stale):
                stale_path = "%s.stale.%s" % (path, token)
                try:
                    os.rename(path, stale_path)
                    shutil.rmtree(stale_path, ignore_errors=True)
                    broke = age
                except OSError:
                    pass
                continue
            if time.time() - started > float(timeout):
                owner = None
                try:
                    with open(os.path.join(path, "owner.json")) as handle:
                        owner = json.load(handle)
                except (OSError, ValueError):
                    pass
                fail("locked", "another deploy of %r holds the lock for %.0f s" % (name, age), owner=owner)
            time.sleep(0.1)
            continue
        with open(os.path.join(path, "owner.json"), "w") as handle:
            json.dump({"token": token, "pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
                       "holder": lock_holder()}, handle)
        emit({"acquired": True, "waited_s": round(time.time() - started, 3), "broke_stale_s": broke})


def cmd_unlock(name, token):
    bundle_dir(name)
    path = os.path.join(BASE, "locks", name)
    try:
        with open(os.path.join(path, "owner.json")) as handle:
            owner = json.load(handle)
    except (OSError, ValueError):
        emit({"released": False})
    if owner.get("token") == token:
        shutil.rmtree(path, ignore_errors=True)
        emit({"released": True})
    emit({"released": False})


COMMANDS = {
    "info": cmd_info, "prepare": cmd_prepare, "abort": cmd_abort, "finish": cmd_finish,
    "rollback": cmd_rollback, "status": cmd_status, "remove": cmd_remove, "lock": cmd_lock,
    "unlock": cmd_unlock, "inflate": cmd_inflate,
}


def main(argv):
    if not argv or argv[0] not in COMMANDS:
        fail("usage", "unknown helper command %r" % (argv[:1],))
    os.umask(0o022)
    try:
        COMMANDS[argv[0]](*argv[1:])
    except TypeError as exc:
        fail("usage", "bad arguments for %s: %s" % (argv[0], exc))
    except OSError as exc:
        kind = "disk_full" if exc.errno in (28, 122) else "os_error"
        fail(kind, "%s: %s" % (exc.strerror or exc, getattr(exc, "filename", "") or ""))


if __name__ == "__main__":
    main(sys.argv[1:])
