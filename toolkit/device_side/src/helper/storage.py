"""Written to stay: files and directories synced to the storage, a file replaced atomically, the ``current``
switch (rename(2) over a fresh symlink), the history saved, a version's files checked against their sha256 (with
shared.py's ``sha256_file``, inlined into the shipped file) and its permissions tidied.
"""
import json
import os
from typing import Any, Dict, List  # noqa: F401 (type comments)
from shared import sha256_file
from .layout import bundle_dir

# --- shipped from here (the lines above are for the host's type checker) ---

def fsync_path(path, directory=False):
    # type: (str, bool) -> None
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
    # type: (str) -> None
    """Every file of ``top`` and every directory in it (deepest first), then ``top`` itself, on the storage: a
    power cut after ``current`` names a version must not find its files still in the page cache."""
    for root, _dirs, names in os.walk(top, topdown=False):
        for entry in names:
            full = os.path.join(root, entry)
            if not os.path.islink(full):
                fsync_path(full)
        fsync_path(root, directory=True)


def write_durably(path, text):
    # type: (str, str) -> None
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
    # type: (str, List[Dict[str, Any]]) -> None
    write_durably(os.path.join(bundle_dir(name), ".history.json"), json.dumps(history))


def file_ok(path, digest):
    # type: (str, str) -> bool
    return os.path.isfile(path) and not os.path.islink(path) and sha256_file(path) == digest


def switch_current(name, version):
    # type: (str, str) -> None
    bdir = bundle_dir(name)
    tmp = os.path.join(bdir, ".current.tmp.%d" % os.getpid())
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(version, tmp)
    os.replace(tmp, os.path.join(bdir, "current"))  # rename(2): atomic
    fsync_path(bdir, directory=True)  # the switch itself on the storage before the host is told it is done


def verify(vdir, files):
    # type: (str, Dict[str, str]) -> List[str]
    bad = []
    for rel, digest in files.items():
        path = os.path.join(vdir, rel)
        if not os.path.isfile(path):
            bad.append(rel + " (missing)")
        elif os.path.islink(path) or sha256_file(path) != digest:
            bad.append(rel + " (sha256 mismatch)")
    return bad


def tidy_permissions(path):
    # type: (str) -> None
    for root, dirs, names in os.walk(path):
        os.chmod(root, 0o755)
        for name in names:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                os.chmod(full, 0o644)
