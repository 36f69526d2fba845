"""Dependencies whose environment markers name the machine, evaluated for the DEVICE rather than this host.

pip evaluates a wheel's ``Requires-Dist`` markers for the machine pip runs on, even with ``--platform``: on an
x86_64 host, ``pip download executorch --platform manylinux_2_28_aarch64`` asks for ``coremltools==9.0`` (whose
marker is ``platform_machine == "x86_64"`` or macOS) and fails, since coremltools publishes no aarch64 wheel. For
the distributions in ``MARKER_DISTS`` the wheel is downloaded without its dependencies, its ``Requires-Dist`` is
evaluated here for the device's machine, system and Python, and those requirements are downloaded with the
rest. The device's own pip then installs from the pushed wheels, evaluating the markers natively.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from toolkit.platform import DevicePlatform

MARKER_DISTS = frozenset({"executorch"})


def device_environment(platform: DevicePlatform) -> dict[str, str]:
    """The marker environment of a Linux device (PEP 508 names)."""
    major, minor = platform.python[:2]
    return {"platform_machine": platform.arch, "platform_system": "Linux", "sys_platform": "linux",
            "os_name": "posix", "python_version": f"{major}.{minor}", "python_full_version": f"{major}.{minor}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def requires_for_device(wheel: Path, platform: DevicePlatform) -> list[str]:
    """The ``Requires-Dist`` of ``wheel`` that apply on the device (no extras), markers dropped."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode("utf-8", "replace")
    env = device_environment(platform)
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if requirement.marker is not None and not requirement.marker.evaluate(env):
            continue
        requirement.marker = None
        out.append(str(requirement))
    return out
