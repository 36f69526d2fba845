"""What the host learned about an SSH device's server, kept between runs: today, whether SFTP starts there.

Why remember it: a device without an sftp-server (Dropbear on OpenWrt, Buildroot, Yocto) fails the SFTP
subsystem request, and Dropbear 2022.83 then sometimes ends the whole connection when the next channel is opened
(findings.md section 6). Asking once per device, on a connection that is then dropped, and never again, keeps
every later connection clean.

The facts live in ``$XDG_CACHE_HOME/edgetk/hosts.json`` (default ``~/.cache``), one entry per
``user@host:port`` AND host key: a re-imaged device (a new key) is asked again. Writes are atomic (a temp file
and a rename); two processes writing at once lose at most one entry, which is simply asked again. A cache that
cannot be read or written is no error: the device is asked each time instead.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

FILE_NAME = "hosts.json"


def facts_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgetk" / FILE_NAME


def host_id(user: str, hostname: str, port: int, key_fingerprint: str) -> str:
    """The entry's key: who we log in as, where, and the host key that answered."""
    return f"{user}@{hostname}:{port} {key_fingerprint}"


def _load(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def sftp_known(key: str) -> bool | None:
    """Whether SFTP started on this host last time it was asked (None: never asked, or the cache is unreadable)."""
    entry = _load(facts_path()).get(key)
    value = entry.get("sftp") if isinstance(entry, dict) else None
    return value if isinstance(value, bool) else None


def remember_sftp(key: str, works: bool) -> None:
    """Record the answer (best effort: a read-only home only means asking again next time)."""
    path = facts_path()
    data = _load(path)
    found = data.get(key)
    entry: dict[str, object] = found if isinstance(found, dict) else {}
    if entry.get("sftp") is works:
        return
    data[key] = {**entry, "sftp": works, "checked": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".hosts.", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(temp, path)
    except OSError:
        Path(temp).unlink(missing_ok=True)
