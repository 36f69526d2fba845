"""What a device is and what it can run: the runner's ``probe`` on the device, plus the shipped target
profile that matches best (``toolkit.model.platform.match_environment``).

The probe first looks at where the toolkit's files go (``~/.edgetk``, or the device's ``home``): can it be written,
is it mounted noexec, and which usual places (``/data``, ``/overlay``, ...) are writable, so that a read-only root is
answered with what to set. It then copies the runner to ``<home>/runner/edgetk_runner.py`` (only when its hash
differs) and runs ``edgetk_runner.py probe`` with the device's Python (stdlib only: it works before numpy is
installed).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from toolkit.device_side import RUNNER_FILE, source_path
from toolkit.device_side.shared import sha256_file
from toolkit.devices.connection import Connection
from toolkit.devices.spec import DeviceSpec
from toolkit.errors import DeviceError, UsageError

# Places a device with a read-only root keeps writable (OpenWrt's overlay, Yocto and Balena data partitions),
# in the order the probe suggests them; /tmp last (often a small tmpfs, emptied at boot, and mounted noexec).
WRITABLE_PLACES = ("/data", "/overlay", "/mnt/data", "/perm", "/var/lib", "/tmp")

# The probe's first step (``python -c``, stdlib only): make <home>/runner, prove a file can be written and synced
# there, read the runner's hash, and for the home and WRITABLE_PLACES whether each is writable and mounted
# noexec. One JSON line; a failed write is an answer ("write_error"), not a crash.
_PLACES = r"""import hashlib, json, os, sys
home, places = sys.argv[1], sys.argv[2:]
def mount(path):
    try:
        flags = os.statvfs(path).f_flag
    except OSError:
        return None
    return {"noexec": bool(flags & 8), "readonly": bool(flags & 1)}
def can_write(path):
    t = os.path.join(path, ".edgetk-write-test.%d" % os.getpid())
    try:
        with open(t, "wb") as f:
            f.write(b"x")
            os.fsync(f.fileno())
        os.remove(t)
        return None
    except OSError as exc:
        return "%s: %s" % (exc.strerror or exc, path)
out = {"home": os.path.abspath(os.path.expanduser(home)), "write_error": None, "hash": "", "places": {}}
d = os.path.join(home, "runner")
try:
    if not os.path.isdir(d):
        os.makedirs(d, 0o755)
    out["write_error"] = can_write(d)
except OSError as exc:
    out["write_error"] = "%s: %s" % (exc.strerror or exc, getattr(exc, "filename", None) or d)
h = out["home"]
while not os.path.isdir(h) and os.path.dirname(h) != h:
    h = os.path.dirname(h)
out["home_mount"] = mount(h)
p = os.path.join(d, "edgetk_runner.py")
if os.path.isfile(p):
    with open(p, "rb") as f:
        out["hash"] = hashlib.sha256(f.read()).hexdigest()
for place in places:
    m = mount(place) if os.path.isdir(place) else None
    if m is not None:
        m["writable"] = not m["readonly"] and can_write(place) is None
        out["places"][place] = m
print(json.dumps(out))
"""


class ProbedDevice(Protocol):
    """What the probe reads of a device (``toolkit.delivery.deployment.Device``, a floor above)."""

    spec: DeviceSpec
    conn: Connection

    @property
    def python(self) -> str: ...

    @property
    def helper_python(self) -> str: ...


def _best_profile(env: dict[str, Any]) -> tuple[str | None, str | None]:  # Any: JSON
    from toolkit.model.platform import match_environment

    try:
        return match_environment(env), None
    except UsageError as exc:  # no profile for this device is an answer, not a failure
        return None, exc.message


def home_setting_hint(device: str, home: str, places: dict[str, Any]) -> str:  # Any: JSON
    """What to set when the toolkit's ``home`` on ``device`` cannot be written: the first writable place the
    probe found that is not noexec, as the inventory line and the option."""
    persistent = [p for p, m in places.items() if m.get("writable") and not m.get("noexec") and p != "/tmp"]
    if persistent:
        where = f"{persistent[0].rstrip('/')}/edgetk"
        return (f"{persistent[0]} is writable: set home = \"{where}\" for {device} in the inventory (or pass "
                f"--device-home {where}).")
    scratch = places.get("/tmp") or {}
    if scratch.get("writable") and not scratch.get("noexec"):
        return ("Only /tmp is writable (emptied at boot): set home = \"/tmp/edgetk\" to try, or make a "
                "persistent place writable for the login user.")
    looked = ", ".join(places) or ", ".join(WRITABLE_PLACES)
    return (f"No writable place found ({looked}): make a directory writable for the login user on a filesystem "
            "that is not noexec and set it as `home` in the inventory (or --device-home).")


def _mount_notes(first: dict[str, Any]) -> list[str]:  # Any: JSON
    notes = []
    if (first.get("home_mount") or {}).get("noexec"):
        notes.append(f"{first['home']} is mounted noexec: setup cannot put a venv there (native libraries do not "
                     "load); set `home` (or --venv) to a place without noexec")
    if ((first.get("places") or {}).get("/tmp") or {}).get("noexec"):
        notes.append("/tmp is mounted noexec (nothing the toolkit runs is put there)")
    return notes


def probe_device(device: ProbedDevice) -> dict[str, Any]:  # Any: JSON
    """Install the runner if needed and run its probe; returns the runner's document plus ``profile``, the
    toolkit's ``home`` there (path, noexec) and ``notes``. Each failure says which step failed: running python,
    writing the home, copying the runner, or the runner's probe itself."""
    local = source_path(RUNNER_FILE)
    digest = sha256_file(str(local))
    base = device.spec.base
    remote = f"{base}/runner/edgetk_runner.py"
    python = device.helper_python  # the base python: the configured one is read from the home, not yet known good
    name = device.spec.name
    check = device.conn.run([python, "-c", _PLACES, base, *WRITABLE_PLACES], timeout=60)
    try:
        first = json.loads(check.stdout.strip().splitlines()[-1]) if check.ok else None
    except (json.JSONDecodeError, IndexError):
        first = None
    if not isinstance(first, dict):
        tail = (check.stderr.strip().splitlines() or check.stdout.strip().splitlines() or ["no output"])[-1][:200]
        if check.returncode == 126:  # found, not executable: its mode, or a noexec mount
            raise DeviceError(f"{name}: cannot execute {python!r} on the device ({tail}).",
                              hint="Make it executable, or put it on a filesystem not mounted noexec; or set "
                              "another `python` for it in the inventory.")
        raise DeviceError(f"{name}: cannot run {python!r} on the device ({tail}).",
                          hint="Install python3 there, or set `python` for it in the inventory.")
    if first.get("write_error"):
        state = "read-only" if "Read-only" in str(first["write_error"]) else "not writable"
        raise DeviceError(f"{name}: the toolkit's home {first.get('home')} is {state} ({first['write_error']}).",
                          hint=home_setting_hint(name, str(first.get("home")), first.get("places") or {}))
    if first.get("hash") != digest:
        try:
            device.conn.put(local, remote)
        except DeviceError as exc:
            raise DeviceError(f"{name}: cannot copy the runner to {remote} ({exc.message}).",
                              hint="Check the free disk there (`df`), or set another `home` for it.") from None
    python = device.python
    result = device.conn.run([python, remote, "probe"], timeout=120)
    try:
        doc = json.loads(result.stdout)
    except json.JSONDecodeError:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise DeviceError(f"{name}: the runner's probe failed with {python!r} (exit code {result.returncode}: {tail}).",
                          hint="Run it by hand there to see why: "
                          f"{python} {remote} probe") from None
    profile, why = _best_profile(doc.get("environment") or {})
    doc["profile"] = profile
    doc["home"] = {"path": first.get("home"), "noexec": bool((first.get("home_mount") or {}).get("noexec"))}
    notes = _mount_notes(first)
    if notes:
        doc["notes"] = notes
    sftp = getattr(device.conn, "sftp_available", None)
    if callable(sftp):  # asked once per device and remembered (toolkit.devices.host_facts)
        doc["sftp"] = bool(sftp())
    if why:
        doc["profile_note"] = why
    return dict(doc)
