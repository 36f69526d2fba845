"""Where things are on the device: the toolkit's home (``BASE``), a bundle's directory, its versions, its
``current`` link and its history; every name, version and path from the host checked again here (no absolute path,
no ``..``, no symlinked directory on the way), so even a hand-crafted listing cannot write outside the bundle.
"""
import json
import os
from typing import Any, Dict, List, Optional  # noqa: F401 (type comments)
from .answer import fail

# --- shipped from here (the lines above are for the host's type checker) ---

# the toolkit's home on the device: $EDGETK_HOME (the host's boot sets it from the device's `home`; the Mender
# module from its own setting), else .edgetk in the home directory (relative paths: the working directory)
BASE = os.environ.get("EDGETK_HOME") or ".edgetk"


GZ_SUFFIX = ".edgetk-gz"  # a file sent gzip-compressed (deploy --compress), inflated by `inflate`


def bundle_dir(name):
    # type: (str) -> str
    if not name or name in (".", "..") or "/" in name or name.startswith((".", "-")) or "\x00" in name:
        fail("usage", "refusing the bundle name %r" % (name,))
    return os.path.join(BASE, "bundles", name)


def safe_rel(rel):
    # type: (str) -> str
    """A path inside a version directory: relative, no '..', no empty or '.' parts."""
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or rel.startswith("/") or "\\" in rel or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
        fail("usage", "refusing the bundle path %r: it would leave the bundle directory" % (rel,))
    return rel


def check_inside(root, path):
    # type: (str, str) -> None
    """``path`` (under ``root``) must not reach outside it through a symlinked directory."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.dirname(path))
    if real != real_root and not real.startswith(real_root + os.sep):
        fail("usage", "refusing %s: a directory on the way is a link out of the bundle" % path)


def check_version(version):
    # type: (str) -> str
    if not version or len(version) > 128 or any(c not in "0123456789abcdef" for c in version):
        fail("usage", "refusing the version %r: a version is a sha256 in hex" % (version,))
    return version


def is_version(entry):
    # type: (str) -> bool
    return 0 < len(entry) <= 128 and all(c in "0123456789abcdef" for c in entry)


def makedirs(path):
    # type: (str) -> None
    if not os.path.isdir(path):
        os.makedirs(path, 0o755)


def free_bytes(path="."):
    # type: (str) -> int
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def existing_dir(path):
    # type: (str) -> str
    """``path`` or its nearest existing ancestor (the filesystem a directory not made yet will be on)."""
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def read_current(name):
    # type: (str) -> Optional[str]
    link = os.path.join(bundle_dir(name), "current")
    if os.path.islink(link):
        return os.readlink(link).rstrip("/")
    return None


def load_history(name):
    # type: (str) -> List[Dict[str, Any]]
    path = os.path.join(bundle_dir(name), ".history.json")
    try:
        with open(path) as handle:
            data = json.load(handle)
        return data if isinstance(data, list) else []
    except (OSError, ValueError):
        return []


def read_config_python():
    # type: () -> Optional[str]
    try:
        with open(os.path.join(BASE, "config.json")) as handle:
            value = json.load(handle).get("python")
        return value if isinstance(value, str) and value else None
    except (OSError, ValueError, AttributeError):
        return None
