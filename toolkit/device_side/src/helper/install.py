"""A version installed, step by step: ``prepare`` (reuse what is in place or in another version, list what
must be sent, prune old versions on request), ``inflate`` (the compressed uploads), ``finish`` (verify, switch
``current``, keep), ``abort`` (a failed push's partial version) and ``prune``.
"""
import json
import os
import shutil
import time
from typing import Any, Dict, List, NoReturn, Optional, Tuple, Union  # noqa: F401 (type comments)
from shared import sha256_file
from .answer import emit, fail
from .layout import (
    BASE, GZ_SUFFIX, bundle_dir, check_inside, check_version, existing_dir, free_bytes, is_version, load_history,
    makedirs, read_current, safe_rel,
)
from .storage import file_ok, fsync_path, save_history, switch_current, sync_tree, tidy_permissions, verify
from .locks import load_verified, lock_owner, release_lock
from .follow import load_follow

# --- shipped from here (the lines above are for the host's type checker) ---

def cmd_inflate(name, version, files_json):
    # type: (str, str, str) -> None
    """Decompress the gzip uploads ``<rel>.edgetk-gz`` of a version into ``<rel>`` and remove them.

    The host sends a file compressed when that pays (deploy --compress). Each is inflated to a temporary file
    and renamed over ``<rel>``; ``finish`` then verifies the sha256 of the decompressed file exactly as for a
    file sent as it is, so a corrupt or truncated upload is refused there (or here, when gzip cannot read it).
    """
    emit({"inflated": inflate(name, version, json.loads(files_json))})


def inflate(name, version, rels):
    # type: (str, str, List[str]) -> List[str]
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
    # type: (str, str, str) -> None
    plan = prepare(name, version, json.loads(files_json))
    plan.pop("verified")
    emit(plan)


STAT_MARGIN_S = 2.0  # coarser than any filesystem's timestamp granularity (FAT: 2 s, ext3: 1 s)


def stat_key(path, hashed_at):
    # type: (str, float) -> Optional[List[int]]
    """What changes when a file is rewritten, replaced, touched or re-linked; a file ``begin`` verified whose
    key is unchanged at ``finish`` is not hashed again. None (hash it again) when the file changed less than
    ``STAT_MARGIN_S`` before it was hashed: a later change within the same timestamp tick would not show."""
    st = os.lstat(path)
    if st.st_ctime > hashed_at - STAT_MARGIN_S or st.st_mtime > hashed_at - STAT_MARGIN_S:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def prepare(name, version, files, prune=False):
    # type: (str, str, List[List[Any]], Optional[bool]) -> Dict[str, Any]
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


def prune_versions(name, keep, spare=()):
    # type: (str, Union[str, int], Tuple[str, ...]) -> Dict[str, Any]
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
    # type: (str, str) -> None
    """``edgetk prune``: old versions away, the current one and the rollback target kept (the host holds the
    bundle's lock around this call)."""
    emit(prune_versions(name, keep))


def abort(name, version):
    # type: (str, str) -> bool
    """Remove a version that was never installed (a failed push); never the current or an installed one."""
    if read_current(name) == version or any(h.get("version") == version for h in load_history(name)):
        return False
    shutil.rmtree(os.path.join(bundle_dir(name), version), ignore_errors=True)
    bdir = bundle_dir(name)
    if os.path.isdir(bdir) and not [e for e in os.listdir(bdir) if not e.startswith(".")]:
        shutil.rmtree(bdir, ignore_errors=True)
    return True


def cmd_abort(name, version, token=None):
    # type: (str, str, Optional[str]) -> None
    """Remove a failed push's partial version; with the push's lock ``token``, release its lock as well."""
    check_version(version)
    try:
        removed = abort(name, version)
    finally:
        if token:
            release_lock(name, token)
    emit({"removed": removed, "free_bytes": free_bytes(existing_dir(BASE))})


def cmd_finish(name, version, files_json, keep, token=None, packed_json="[]"):
    # type: (str, str, str, str, Optional[str], str) -> None
    """Verify every file, switch ``current``, keep ``keep`` versions. With the push's lock ``token`` (from
    ``begin``): first inflate the compressed uploads ``packed_json``, skip hashing the files ``begin`` verified
    whose stat is unchanged, and release the lock whatever happens."""
    try:
        finish(name, version, files_json, keep, token, json.loads(packed_json))
    finally:
        if token:
            release_lock(name, token)


def finish(name, version, files_json, keep, token, packed):
    # type: (str, str, str, str, Optional[str], List[str]) -> NoReturn
    files = dict((safe_rel(rel), digest) for rel, digest, _ in json.loads(files_json))
    versions_kept = max(1, int(keep))
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
    dropped, history = history[:-versions_kept], history[-versions_kept:]
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
