# mypy: ignore-errors
"""The device side of deploy: installed once per device as ``~/.edgetk/helper/<sha256>.py`` and run (from a
compiled cache, see ``toolkit.delivery.deployment._BOOT``) as ``python -S -c BOOT SUBCOMMAND ARGS...``.

Python >= 3.6, stdlib only (it must work on a device with no numpy and on Jetson's Python 3.6). Arguments
arrive as separate argv words (the host quotes each one), so names are data, never shell. Every path is
relative to the home directory (the working directory of SSH sessions and of ``local``). It prints one JSON
object between frame markers (so that other text on stdout cannot be taken for it); exit 0 = done, 3 = a refusal the host turns into a plain message ({"kind", "error", ...}).

Layout (``.edgetk`` stands for the toolkit's home on the device, ``$EDGETK_HOME``: see ``BASE``):
``.edgetk/bundles/<name>/<version>/`` (files mirror the bundle), ``.edgetk/bundles/<name>/current`` ->
``<version>`` (switched with rename(2) over a fresh symlink: atomic), ``.edgetk/bundles/<name>/.history.json``
(installed versions, oldest first, with every file's sha256, so rollback can verify what it switches to),
``.edgetk/locks/<name>/`` (mkdir is atomic: the deploy lock). The lock records the device's boot id and its
holder: the first non-shell ancestor of the helper (the per-connection sshd or dropbear process over SSH, the
edgetk process on ``local``) with its start time from /proc, plus who asked (the controller's host and pid,
what and which version, for the waiting side's message). A lock is broken only when its holder is provably gone
(another boot id, or the same boot and that process dead or its pid reused), at once, so a re-run after a link
cut does not wait; never by its age, which a device clock that jumps (no RTC, NTP after boot) would fake; and on
request (``--break-lock``) for the stuck case.

Every bundle-relative path from the host is checked again here (no absolute paths, no ``..``, no symlinked
directories on the way), so even a hand-crafted listing cannot write outside ``.edgetk/bundles/<name>/``.

A push costs two helper runs (each a fresh Python on the device, so each one counts), three when the files go as
one framed stream (``receive``, on devices without SFTP): ``begin`` (refuse a
foreign arch, probe, take the lock, prepare) and ``finish`` (inflate compressed uploads, verify, switch, keep,
release the lock, in a ``finally``); a failed write calls ``abort`` (remove the partial version, release the
lock). ``begin`` records the files it found already in place with the right sha256 (and their stat) in the
lock directory, so ``finish`` hashes only what was uploaded and any file whose stat changed since. The single
steps (``info``, ``lock``, ``prepare``, ``inflate``, ``unlock``) stay for rollback, remove and older callers.
The host runs this file with ``python -S`` (no site packages: it needs none, and site start-up with many
``.pth`` files costs tens of milliseconds per run); ``zlib`` is imported only where used. The probe
(``probe_*``) is ``device_probe.py``'s block and ``sha256_file`` is ``shared.py``'s, each inlined where its
marker line stands when the file is assembled.
"""
import json
import os
import shutil
import sys
import time

# --- device probe: device_probe.py's block, inlined here when assembled (toolkit.device_side) ---


# the toolkit's home on the device: $EDGETK_HOME (the host's boot sets it from the device's `home`; the Mender
# module from its own setting), else .edgetk in the home directory (relative paths: the working directory)
BASE = os.environ.get("EDGETK_HOME") or ".edgetk"
GZ_SUFFIX = ".edgetk-gz"  # a file sent gzip-compressed (deploy --compress), inflated by `inflate`
SHELLS = ("sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "fish", "busybox", "tcsh", "csh")


FRAME_BEGIN = "\x1eedgetk-json\n"  # the host reads the JSON from between these (toolkit.delivery.deployment.unframe)
FRAME_END = "\n\x1eedgetk-end\n"


def emit(obj, code=0):
    reply(obj)
    sys.exit(code)


def reply(obj):
    """An answer the host reads while this run goes on (``push``: begin's plan before the files arrive)."""
    sys.stdout.write(FRAME_BEGIN + json.dumps(obj) + FRAME_END)
    sys.stdout.flush()


def fail(kind, message, **extra):
    extra.update({"kind": kind, "error": message})
    emit(extra, 3)


# --- file hash: shared.py's block, inlined here when assembled (toolkit.device_side) ---


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
    """This boot's id (/proc/sys/kernel/random/boot_id), or None where the kernel has none to give."""
    text = (probe_read("/proc/sys/kernel/random/boot_id") or "").strip()
    return text or None


def uptime_s():
    """Seconds since boot from /proc/uptime: a clock that NTP, a missing RTC or libfaketime cannot move."""
    try:
        return float((probe_read("/proc/uptime") or "").split()[0])
    except (ValueError, IndexError):
        return None


def holder_gone(owner):
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


def fsync_path(path, directory=False):
    """Flush ``path`` (a file, or a directory's entries) to the storage. A filesystem that cannot sync a
    directory (EINVAL on some FUSE and network mounts) is not an error: there is nothing more to do there."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sync_tree(top):
    """Every file of ``top`` and every directory in it (deepest first), then ``top`` itself, on the storage: a
    power cut after ``current`` names a version must not find its files still in the page cache."""
    for root, _dirs, names in os.walk(top, topdown=False):
        for entry in names:
            full = os.path.join(root, entry)
            if not os.path.islink(full):
                fsync_path(full)
        fsync_path(root, directory=True)


def write_durably(path, text):
    """``path`` replaced by ``text`` atomically (a temp file, synced, renamed over it, the directory synced)."""
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    fsync_path(os.path.dirname(path) or ".", directory=True)


def save_history(name, history):
    write_durably(os.path.join(bundle_dir(name), ".history.json"), json.dumps(history))


def file_ok(path, digest):
    return os.path.isfile(path) and not os.path.islink(path) and sha256_file(path) == digest


def switch_current(name, version):
    bdir = bundle_dir(name)
    tmp = os.path.join(bdir, ".current.tmp.%d" % os.getpid())
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(version, tmp)
    os.replace(tmp, os.path.join(bdir, "current"))  # rename(2): atomic
    fsync_path(bdir, directory=True)  # the switch itself on the storage before the host is told it is done


def verify(vdir, files):
    bad = []
    for rel, digest in files.items():
        path = os.path.join(vdir, rel)
        if not os.path.isfile(path):
            bad.append(rel + " (missing)")
        elif os.path.islink(path) or sha256_file(path) != digest:
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


def existing_dir(path):
    """``path`` or its nearest existing ancestor (the filesystem a directory not made yet will be on)."""
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def device_info():
    """The probe's basics plus what a push needs: free disk where bundles go, the configured Python, zlib."""
    info = probe_basics()
    info.update({
        # where bundles go: ~/.edgetk may be its own filesystem (an SD card's data partition)
        "free_bytes": free_bytes(existing_dir(BASE)),
        "config_python": read_config_python(),
        "zlib": zlib_available(),
    })
    return info


def cmd_info():
    emit(device_info())


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
    emit({"inflated": inflate(name, version, json.loads(files_json))})


def inflate(name, version, rels):
    import zlib

    vdir = os.path.join(bundle_dir(name), check_version(version))
    done = []
    for rel in rels:
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
    return done


def cmd_prepare(name, version, files_json):
    plan = prepare(name, version, json.loads(files_json))
    plan.pop("verified")
    emit(plan)


STAT_MARGIN_S = 2.0  # coarser than any filesystem's timestamp granularity (FAT: 2 s, ext3: 1 s)


def stat_key(path, hashed_at):
    """What changes when a file is rewritten, replaced, touched or re-linked; a file ``begin`` verified whose
    key is unchanged at ``finish`` is not hashed again. None (hash it again) when the file changed less than
    ``STAT_MARGIN_S`` before it was hashed: a later change within the same timestamp tick would not show."""
    st = os.lstat(path)
    if st.st_ctime > hashed_at - STAT_MARGIN_S or st.st_mtime > hashed_at - STAT_MARGIN_S:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def prepare(name, version, files, prune=False):
    """Create the version dir; reuse files already there or in another version; list what must be sent.

    ``files`` is ``[[rel, sha256, bytes], ...]``; ``verified`` in the answer maps each file found (or linked)
    in place with the right sha256 to its ``stat_key``. When the disk cannot hold what is left to send and
    ``prune`` (deploy --prune), old versions go first (``prune_versions``: never the current one or the
    rollback target); the answer's ``pruned`` says what went."""
    bdir = bundle_dir(name)
    vdir = os.path.join(bdir, check_version(version))
    for rel, _, _ in files:
        safe_rel(rel)
    makedirs(vdir)
    others = [os.path.join(bdir, v) for v in sorted(os.listdir(bdir))
              if v != version and not v.startswith(".") and v != "current" and os.path.isdir(os.path.join(bdir, v))]
    missing, reused, present, need, partial, verified = [], [], 0, 0, {}, {}
    for rel, digest, size in files:
        path = os.path.join(vdir, rel)
        check_inside(vdir, path)
        makedirs(os.path.dirname(path))
        check_inside(vdir, path)
        if os.path.islink(path):
            os.remove(path)
        hashed_at = time.time()
        if file_ok(path, digest):
            present += 1
            key = stat_key(path, hashed_at)
            if key is not None:
                verified[rel] = key
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
            reused.append(rel)  # linked just now (a new ctime): finish hashes it again
            continue
        missing.append(rel)
        have = os.path.getsize(path) if os.path.isfile(path) else 0
        if 0 < have < size:
            # an upload cut short: the host resumes it if these bytes are a prefix of its file
            partial[rel] = [have, sha256_file(path)]
            need += size - have
        else:
            if os.path.isfile(path):
                os.remove(path)  # a wrong or empty leftover: sent afresh, as a new file (see follow)
            need += size
    free = free_bytes(vdir)
    pruned = None
    if need + (1 << 20) > free and prune:
        pruned = prune_versions(name, 1, spare=(version,))
        free = free_bytes(vdir)
    if need + (1 << 20) > free:
        abort(name, version)
        fail("disk_full", "needs %.1f MB free for the bundle, the device has %.1f MB%s" % (
            need / 1e6, free / 1e6, " after removing %d old version(s)" % len(pruned["removed"]) if pruned else ""),
             need_bytes=need, free_bytes=free, name=name, pruned=pruned)
    return {"missing": missing, "reused": reused, "present": present, "free_bytes": free, "partial": partial,
            "verified": verified, "pruned": pruned}


def is_version(entry):
    return 0 < len(entry) <= 128 and all(c in "0123456789abcdef" for c in entry)


def prune_versions(name, keep, spare=()):
    """Keep the current version and the ``keep - 1`` installed before it (what successive rollbacks return to),
    and always the rollback target and ``spare`` (a push in progress); remove every other version: older ones,
    ones newer than the current (rolled back from: no rollback reaches them) and leftovers of failed pushes.
    The caller holds the bundle's lock. Files shared by hard links with a kept version free nothing."""
    bdir = bundle_dir(name)
    if not os.path.isdir(bdir):
        fail("not_installed", "the bundle %r is not installed" % name)
    current = read_current(name)
    history = load_history(name)
    versions = [h.get("version") for h in history]
    target = versions[versions.index(current) - 1] if current in versions and versions.index(current) > 0 else None
    at = versions.index(current) if current in versions else len(versions) - 1
    kept = set(versions[max(0, at + 1 - max(1, int(keep))):at + 1])
    kept |= set(v for v in (current, target) + tuple(spare) if v)
    before = free_bytes(bdir)
    removed = []
    for entry in sorted(os.listdir(bdir)):
        full = os.path.join(bdir, entry)
        if not is_version(entry) or entry in kept or os.path.islink(full) or not os.path.isdir(full):
            continue
        shutil.rmtree(full)
        removed.append(entry)
    save_history(name, [h for h in history if h.get("version") not in removed])
    return {"current": current, "rollback_target": target, "removed": removed,
            "kept": [v for v in versions if v not in removed],
            "freed_bytes": max(0, free_bytes(bdir) - before) if removed else 0}


def cmd_prune(name, keep):
    """``edgetk prune``: old versions away, the current one and the rollback target kept (the host holds the
    bundle's lock around this call)."""
    emit(prune_versions(name, keep))


def abort(name, version):
    """Remove a version that was never installed (a failed push); never the current or an installed one."""
    if read_current(name) == version or any(h.get("version") == version for h in load_history(name)):
        return False
    shutil.rmtree(os.path.join(bundle_dir(name), version), ignore_errors=True)
    bdir = bundle_dir(name)
    if os.path.isdir(bdir) and not [e for e in os.listdir(bdir) if not e.startswith(".")]:
        shutil.rmtree(bdir, ignore_errors=True)
    return True


def cmd_abort(name, version, token=None):
    """Remove a failed push's partial version; with the push's lock ``token``, release its lock as well."""
    check_version(version)
    try:
        removed = abort(name, version)
    finally:
        if token:
            release_lock(name, token)
    emit({"removed": removed, "free_bytes": free_bytes(existing_dir(BASE))})


def cmd_finish(name, version, files_json, keep, token=None, packed_json="[]"):
    """Verify every file, switch ``current``, keep ``keep`` versions. With the push's lock ``token`` (from
    ``begin``): first inflate the compressed uploads ``packed_json``, skip hashing the files ``begin`` verified
    whose stat is unchanged, and release the lock whatever happens."""
    try:
        finish(name, version, files_json, keep, token, json.loads(packed_json))
    finally:
        if token:
            release_lock(name, token)


def finish(name, version, files_json, keep, token, packed):
    files = dict((safe_rel(rel), digest) for rel, digest, _ in json.loads(files_json))
    keep = max(1, int(keep))
    bdir = bundle_dir(name)
    vdir = os.path.join(bdir, check_version(version))
    if packed:
        inflate(name, version, packed)
    for root, _dirs, names in os.walk(vdir):
        for leftover in names:
            if leftover.endswith(GZ_SUFFIX):  # a compressed upload cut short by an earlier push
                os.remove(os.path.join(root, leftover))
    unchanged = set()
    waited = time.time()
    if token:
        known = load_verified(name, token, version)
        for rel, (digest, key) in load_follow(name, token, version).items():
            if files.get(rel) == digest:
                known[rel] = key
        for rel, key in known.items():
            path = os.path.join(vdir, rel)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if rel in files and [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] == key:
                unchanged.add(rel)
    waited = time.time() - waited
    bad = verify(vdir, {rel: d for rel, d in files.items() if rel not in unchanged})
    if bad:
        fail("integrity", "files do not match their sha256 after the upload: " + ", ".join(bad), bad=bad)
    tidy_permissions(vdir)
    sync_tree(vdir)  # files and their directories on the storage before `current` names them
    fsync_path(bdir, directory=True)
    previous = read_current(name)
    switch_current(name, version)
    old = load_history(name)
    previous_by = next((h.get("by") for h in old if h.get("version") == previous), None)
    history = [h for h in old if h.get("version") != version]
    owner = lock_owner(name) if token else None
    history.append({"version": version, "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "files": files, "by": owner.get("by") if owner and owner.get("token") == token else None})
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
    emit({"current": version, "previous": previous, "previous_by": previous_by, "removed": removed,
          "dropped": [h["version"] for h in dropped],
          "hashed": len(files) - len(unchanged), "follow_wait_s": round(waited, 3)})


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


SELECTED = "selected.json"  # beside ``current``: the artifact the last check selected (toolkit/checks/selection.py)


def read_selected(name):
    try:
        with open(os.path.join(bundle_dir(name), SELECTED)) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def cmd_select(name, doc_json, request=None, timeout="120"):
    """Write the selection of the installed version: a compare-and-swap on ``current``, under the bundle's lock
    (so no push's switch falls between the comparison and the write), written durably. When another version
    was installed since this selection's check began, refuse (``not_current``) naming that version and who
    installed it: that version's own check decides its selection."""
    bdir = bundle_dir(name)
    if not os.path.isdir(bdir):
        fail("not_installed", "the bundle %r is not installed" % name)
    try:
        doc = json.loads(doc_json)
    except ValueError:
        fail("usage", "the selection is not JSON")
    token = "select-%d-%d" % (os.getpid(), int(time.time() * 1000))
    acquire_lock(name, float(timeout), request or '{"what": "selection"}', token)
    try:
        current = read_current(name)
        if not isinstance(doc, dict) or doc.get("version") != current:
            by = next((h.get("by") for h in load_history(name) if h.get("version") == current), None)
            fail("not_current", "the selection is for version %s, but %s is installed"
                 % (str(doc.get("version") if isinstance(doc, dict) else None)[:12], (current or "none")[:12]),
                 current=current, by=by)
        artifact = doc.get("artifact")
        if artifact is not None and not os.path.isfile(os.path.join(bdir, current, safe_rel(artifact))):
            fail("usage", "the selected artifact %r is not in version %s" % (artifact, current[:12]))
        write_durably(os.path.join(bdir, SELECTED), json.dumps(doc, indent=1, sort_keys=True))
    finally:
        release_lock(name, token)
    emit({"selected": artifact})


def cmd_selected(name):
    emit({"selected": read_selected(name)})


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
                "selected": read_selected(name),
                "versions": [{"version": h.get("version"), "installed_at": h.get("installed_at"), "by": h.get("by")}
                             for h in history],
            }
    emit({"bundles": out})


def cmd_remove(name):
    bdir = bundle_dir(name)
    if not os.path.isdir(bdir):
        fail("not_installed", "the bundle %r is not installed" % name)
    shutil.rmtree(bdir)
    emit({"removed": name})


def cmd_lock(name, timeout, request, token):
    emit(acquire_lock(name, timeout, request, token))


OWNERLESS_S = 30.0  # a lock directory with no owner record for this long (its taker died at once) is broken


def read_request(request):
    """The host's lock request (JSON): {"break": bool, "by": {"host", "pid", "user"}, "what", "version"}."""
    try:
        data = json.loads(request) if request else {}
    except ValueError:
        data = {}
    return data if isinstance(data, dict) else {}


def held_for(owner):
    """Seconds the lock has been held, from /proc/uptime (same boot only), else None: never the wall clock."""
    now = uptime_s()
    if not isinstance(owner, dict) or now is None or owner.get("uptime") is None or owner.get("boot_id") != boot_id():
        return None
    return round(max(0.0, now - float(owner["uptime"])), 1)


def break_lock(path, token, judged=None, check=True):
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
    """Take ``.edgetk/locks/<name>`` (atomic mkdir), waiting up to ``timeout`` seconds for its holder.

    A lock is broken only when its holder is provably gone (``holder_gone``), or on request (``--break-lock``),
    never by its age: a device clock that jumps (no RTC, NTP syncing after boot) cannot make a live lock look
    old. The waiting is timed with ``time.monotonic`` of this process, which a clock jump does not move. The
    refusal after ``timeout`` names the holder (``owner``) so that the host can say whom it waits for."""
    bundle_dir(name)  # validates the name
    request = read_request(request)
    locks = os.path.join(BASE, "locks")
    makedirs(locks)
    path = os.path.join(locks, name)
    started = time.monotonic()
    broke, waited_for, ownerless_since = None, None, None
    while True:
        if request.get("break") and broke is None and os.path.isdir(path):
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
                  "boot_id": boot_id(), "uptime": uptime_s(), "holder": lock_holder(), "by": request.get("by"),
                  "what": request.get("what") or "deploy", "version": request.get("version")}
        tmp = os.path.join(path, "owner.json.tmp")
        with open(tmp, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, os.path.join(path, "owner.json"))  # readers see a whole record or none
        return {"acquired": True, "waited_s": round(time.monotonic() - started, 3), "broke": broke,
                "waited_for": waited_for}


def lock_owner(name):
    try:
        with open(os.path.join(BASE, "locks", name, "owner.json")) as handle:
            owner = json.load(handle)
        return owner if isinstance(owner, dict) else None
    except (OSError, ValueError):
        return None


def release_lock(name, token):
    bundle_dir(name)
    owner = lock_owner(name)
    if owner is None or owner.get("token") != token:
        return False
    shutil.rmtree(os.path.join(BASE, "locks", name), ignore_errors=True)
    return True


def cmd_unlock(name, token):
    emit({"released": release_lock(name, token)})


def save_verified(name, token, version, verified):
    """``begin``'s verified files, kept in the lock directory (ours while we hold it) for ``finish``."""
    path = os.path.join(BASE, "locks", name, "verified.json")
    with open(path, "w") as handle:
        json.dump({"token": token, "version": version, "files": verified}, handle)


def load_verified(name, token, version):
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


NUMPY_CHECK = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('numpy') else 1)"


NUMPY_OK = os.path.join(BASE, "helper", "numpy-ok.json")  # Pythons seen with numpy (only positives are kept)


def _numpy_ok_list():
    try:
        with open(NUMPY_OK) as handle:
            data = json.load(handle)
        return data if isinstance(data, list) else []
    except (OSError, IOError, ValueError):
        return []


def start_numpy_check(python):
    """Whether the runner's Python has numpy, asked in a child started now and read at the end of begin (so it
    overlaps the lock and the hashing); None when that Python does not start. A Python once seen with numpy is
    not asked again (a Python that lacks it is asked every time, so a later `edgetk devices setup` shows)."""
    python = python or read_config_python() or "python3"
    found = shutil.which(python) if os.sep not in python else python
    # the path as named, not resolved: a venv's python is a link to the base interpreter, with other packages
    key = os.path.abspath(found) if found else None
    if key and key in _numpy_ok_list():
        return python, key, None
    import subprocess  # only now: importing it costs a slow board tens of ms, and most pushes need no child

    try:
        null = open(os.devnull, "wb")
        return python, key, subprocess.Popen([python, "-c", NUMPY_CHECK], stdout=null, stderr=null)
    except (OSError, IOError):
        return python, key, False


def finish_numpy_check(started):
    python, key, proc = started
    if proc is None:
        return {"runner_python": python, "numpy": True}
    if proc is False:
        return {"runner_python": python, "numpy": None}
    try:
        code = proc.wait(timeout=30)
    except Exception:
        proc.kill()
        code = None
    if code == 0 and key:
        try:
            seen = _numpy_ok_list()[-20:] + [key]
            tmp = "%s.%d" % (NUMPY_OK, os.getpid())
            makedirs(os.path.dirname(NUMPY_OK))
            with open(tmp, "w") as handle:
                json.dump(seen, handle)
            os.replace(tmp, NUMPY_OK)
        except (OSError, IOError):
            pass
    return {"runner_python": python, "numpy": None if code is None else code == 0}


def cmd_begin(name, version, files_json, timeout, request, token, arches_json="[]", follow="0", runner_python=""):
    emit(begin(name, version, files_json, timeout, request, token, arches_json, follow, runner_python))


def cmd_push(name, version, files_json, timeout, request, token, arches_json, runner_python, keep):
    """A whole streamed push in one run and one channel: ``begin`` (its plan answered at once on stdout), then
    ``receive`` of the missing files the host sends on stdin after reading that plan, then ``finish``. A
    refusal of ``begin`` (a held lock, a foreign arch) ends the run before any file is read."""
    reply(begin(name, version, files_json, timeout, request, token, arches_json, "0", runner_python))
    cmd_receive(name, version, token, files_json, keep)


def begin(name, version, files_json, timeout, request, token, arches_json="[]", follow="0", runner_python=""):
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


FOLLOW_IDLE_S = 30.0  # a follower whose upload makes no progress for this long gives up (finish hashes)
FOLLOW_WAIT_S = 10.0  # how long finish waits for a follower that is still hashing


def start_follower(name, version, token, fresh):
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
    """Hash each file the host sends afresh while it arrives, so that finish need not read it again.

    Each such file is new (prepare removed any leftover; a cut-short one that the host may resume is not
    followed), and the upload writes it front to back, once: a byte below the file's size is final when read.
    The answer per file is its sha256 and its stat when the last byte was read; ``finish`` trusts it only when
    the digest is the expected one and the stat is still the same (otherwise it hashes the file itself). The
    follower stops when the lock is no longer this push's (finish, abort, a broken lock) or the upload stalls.
    """
    vdir = os.path.join(bundle_dir(name), version)
    me = proc_stat(os.getpid())
    state = {"pid": os.getpid(), "start": me[2] if me else None, "done": False, "files": {}}
    checked = time.time()
    for rel, size in fresh:
        path = os.path.join(vdir, rel)
        import hashlib

        digest = hashlib.sha256()
        handle, pos, progress = None, 0, time.time()
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
        files = data.get("files") if isinstance(data.get("files"), dict) else {}
        if data.get("done") or time.time() > deadline:
            return files
        stat = proc_stat(int(data.get("pid") or 0))
        if stat is None or stat[2] != data.get("start"):
            return files  # the follower is gone: what it finished still counts
        time.sleep(0.003)


PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged pipe (/proc/sys/fs/pipe-max-size)


def widen_pipe(stream):
    """Let the SSH server queue up to ``PIPE_BYTES`` of the stream in our stdin pipe (Linux: 64 KiB by default)
    while we hash and write a block: it writes each packet at once and returns its window to the host, instead of
    stalling the link until we read again. Not a pipe, not Linux, over the limit: left as it is."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, OSError, ValueError):
        pass


def cmd_receive(name, version, token, files_json="", keep=""):
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
            out = open(path, "r+b")
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


COMMANDS = {
    "info": cmd_info, "prepare": cmd_prepare, "abort": cmd_abort, "finish": cmd_finish,
    "rollback": cmd_rollback, "status": cmd_status, "remove": cmd_remove, "lock": cmd_lock,
    "unlock": cmd_unlock, "inflate": cmd_inflate, "begin": cmd_begin, "receive": cmd_receive, "prune": cmd_prune,
    "push": cmd_push, "select": cmd_select, "selected": cmd_selected,
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
