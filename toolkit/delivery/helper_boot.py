"""The host's side of running the device helper (``toolkit/device_side/device_helper.py``): the short ``-c``
program that runs the copy installed once per device, and the JSON frame its answer comes in."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any

from toolkit import device_side

BASE = ".edgetk"
HELPER_DIR = f"{BASE}/helper"
FRAME_BEGIN = "\x1eedgetk-json\n"  # the helper prints its JSON between these (a noisy process cannot break it)
FRAME_END = "\n\x1eedgetk-end\n"

# The ``-c`` program that runs the helper installed once per device at ~/.edgetk/helper/<sha256>.py (the host
# installs it when this program answers "helper_missing"), from a compiled copy cached next to it when there is
# one (compiling the helper costs more than starting Python; a slow ARM board pays tens of milliseconds per
# call). The cache file is named by the source's sha256 and the device Python's bytecode tag and exact version,
# holds a CRC-32 of the code, is written atomically with mode 0644 and used only when it is the user's own and
# not writable by others; the installed source is compiled only when its sha256 is the expected one. Any cache
# problem falls back to compiling the source, so the cache can only save time. The command line stays ~1.5 KB
# whatever the helper's size (it used to carry the whole 30 KB helper with every call).
_BOOT = """import marshal, os, sys
d = os.path.join(os.path.expanduser("~"), ".edgetk", "helper")
src = os.path.join(d, "HASH.py")
p = os.path.join(d, "HASH-%s-%x.bin" % (sys.implementation.cache_tag, sys.hexversion))
code = None
try:
    from binascii import crc32
    with open(p, "rb") as f:
        st = os.fstat(f.fileno())
        data = f.read()
    if st.st_uid == os.getuid() and not st.st_mode & 0o022 and int(data[:8], 16) == crc32(data[8:]):
        code = marshal.loads(data[8:])
except Exception:
    pass
if code is None:
    import hashlib
    try:
        with open(src, "rb") as f:
            text = f.read()
    except (IOError, OSError):
        text = b""
    if hashlib.sha256(text).hexdigest() != "FULL":
        sys.stdout.write('FRAME_BEGIN{"kind": "helper_missing", "error": "the helper is not installed"}FRAME_END')
        sys.exit(3)
    code = compile(text, src, "exec")
    t = "%s.%d" % (p, os.getpid())
    try:
        os.umask(0o022)
        data = marshal.dumps(code)
        with open(t, "wb") as f:
            f.write(b"%08x" % crc32(data) + data)
        os.chmod(t, 0o644)
        os.replace(t, p)
    except Exception:
        try:
            os.remove(t)
        except Exception:
            pass
sys.argv[0] = src
exec(code, {"__name__": "__main__"})
"""


@lru_cache(maxsize=1)
def helper_source() -> str:
    return device_side.source_path(device_side.HELPER_FILE).read_text()


@lru_cache(maxsize=1)
def helper_digest() -> str:
    return hashlib.sha256(helper_source().encode()).hexdigest()


@lru_cache(maxsize=1)
def helper_boot() -> str:
    """The ``-c`` program that runs the installed helper (see ``_BOOT``)."""
    frame = {"FRAME_BEGIN": FRAME_BEGIN.encode("unicode_escape").decode(),
             "FRAME_END": FRAME_END.encode("unicode_escape").decode()}
    boot = _BOOT.replace("HASH", helper_digest()[:32]).replace("FULL", helper_digest())
    for key, value in frame.items():
        boot = boot.replace(key, value)
    return boot


def unframe(stdout: str) -> str | None:
    """The helper's JSON from between its frame markers (None: no frame, the helper did not get to print)."""
    start = stdout.rfind(FRAME_BEGIN)
    if start < 0:
        return None
    end = stdout.find(FRAME_END, start)
    return stdout[start + len(FRAME_BEGIN):end if end >= 0 else None]


def helper_json(stdout: str) -> dict[str, Any] | None:
    """The helper's JSON answer (framed, or plain from an older helper), None when there is none."""
    text = unframe(stdout)
    if text is None:
        text = stdout  # an older helper on the device, or none: plain JSON
    try:
        data = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None

