"""The ExecuTorch version lock, on the host before a push: a ``.pte`` is loaded only by the executorch release
that exported it (recorded in its manifest record), and the device's runner refuses any other as
``missing_runtime`` (docs/runner.md, "Version lock"). A deploy asks the device's runner Python which release it
has, without importing it, and refuses before anything is locked or sent when no artifact of the bundle could
run there; when others could, it warns and the check reports the ``.pte`` as the runner does.

A device without executorch is not refused here: deploying before ``devices setup`` is allowed, and its check
names the runtime to install.
"""

from __future__ import annotations

from collections.abc import Mapping

from toolkit.delivery.bundle import Bundle
from toolkit.delivery.deployment import Device
from toolkit.errors import MissingRuntime
from toolkit.model.vocabulary import Format

# The installed distribution's version, without importing it (Python >= 3.6: importlib.metadata, else a dist-info
# scan of sys.path, as the runner's _dist_version); prints the version or nothing.
_PROGRAM = """import os, re, sys
try:
    from importlib import metadata
    try:
        print(metadata.version("executorch"))
    except metadata.PackageNotFoundError:
        pass
except ImportError:
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        found = [m.group(1) for m in map(re.compile(r"^executorch-([^-]+?)\\.dist-info$").match, names) if m]
        if found:
            print(found[0])
            break
"""


def exporters(bundle: Bundle) -> dict[str, str]:
    """Each ``.pte`` artifact's file -> the executorch release that exported it (where recorded)."""
    return {a.file: a.pte.executorch_version for a in bundle.manifest.artifacts
            if a.format == Format.PTE and a.pte is not None and a.pte.executorch_version}


def device_executorch(device: Device) -> str | None:
    """The executorch release installed for the device's runner Python, or None (none, or that Python fails)."""
    result = device.conn.run([device.python, "-c", _PROGRAM], timeout=120)
    lines = result.stdout.strip().splitlines() if result.ok else []
    return lines[-1].strip() if lines else None


def mismatch(device_name: str, needed: Mapping[str, str], installed: str) -> MissingRuntime:
    """The runner's own words for a program of another release, for every such artifact at once."""
    files = sorted(f for f, version in needed.items() if version != installed)
    wanted = sorted({needed[f] for f in files})
    exported = "; ".join(f"{f} was exported by executorch {needed[f]}" for f in files)
    return MissingRuntime(
        f"{device_name}: {exported}; the device has executorch {installed}, which is not guaranteed to load "
        f"{'it' if len(files) == 1 else 'them'}.",
        hint=f"Install executorch=={wanted[0]} on the device: `edgetk devices setup --device {device_name} "
             f"--runtime executorch` (or pip install --no-deps executorch=={wanted[0]}), or convert with "
             f"executorch {installed} on the host.")


def refuse_other_release(device: Device, bundle: Bundle) -> list[str]:
    """Raise :class:`MissingRuntime` when every artifact of ``bundle`` is a ``.pte`` of another executorch release
    than the device's; the warnings to print when only some are (their check reports them as missing_runtime)."""
    needed = exporters(bundle)
    if not needed:
        return []
    installed = device_executorch(device)
    if installed is None or all(version == installed for version in needed.values()):
        return []
    error = mismatch(device.spec.name, needed, installed)
    others = [a.file for a in bundle.manifest.artifacts if a.file not in needed or needed[a.file] == installed]
    if not others:
        raise error
    return [f"{error.message} Its check reports them as missing_runtime and measures {', '.join(others)}. "
            f"{error.hint}"]
