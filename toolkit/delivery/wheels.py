"""The wheels offline setup installs (:mod:`toolkit.delivery.provisioning`): ``pip download`` run on this host
for the device's platform (every manylinux tag its glibc allows, its Python version and ABI) into a host cache per
platform, and the refusal that names what has no wheel there and which runtimes do.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import DeviceError, UsageError
from toolkit.model.platform import DevicePlatform
from toolkit.model.vocabulary import Runtime
from toolkit.runtimes.spec import RUNTIME_SPECS

Log = Callable[[str], None]


@dataclass(frozen=True)
class Requirement:
    """One thing to install: a runtime (or numpy/pip) with the pip specifier the profile allows."""

    name: str
    dist: str
    specifier: str = ""
    without_deps: bool = False  # installed --no-deps (RuntimeSpec.without_deps)

    @property
    def pip(self) -> str:
        return f"{self.dist}{self.specifier}"



def wheel_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgetk" / "wheels"


@dataclass(frozen=True)
class WheelSet:
    """The wheels ``pip download`` chose for one device platform (paths in the host cache)."""

    platform: DevicePlatform
    directory: Path
    files: tuple[Path, ...]
    pip_wheel: Path
    from_cache_only: bool


_SAVED = re.compile(r"^\s*(?:Saved|File was already downloaded)\s+(.+?\.whl)\s*$")


def _pip_platform_args(platform: DevicePlatform) -> list[str]:
    args = ["--only-binary=:all:"]
    for tag in platform.platform_tags():
        args += ["--platform", tag]
    args += ["--python-version", platform.python_version, "--implementation", platform.implementation,
             "--abi", platform.abi_tag]
    return args


def _run_pip(args: Sequence[str], *, cwd: Path, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_PROGRESS_BAR="off")
    try:
        return subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True,
                              env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise DeviceError(f"pip on this machine did not finish within {timeout:.0f} s.",
                          hint="Check this machine's network access to the package index.") from None


def available_versions(dist: str, platform: DevicePlatform) -> list[str]:
    """Versions of ``dist`` that have a wheel for ``platform`` (``pip index versions``; [] when none)."""
    if not platform.platform_tags():
        return []
    with tempfile.TemporaryDirectory(prefix="edgetk-pip-") as tmp:
        proc = _run_pip(["index", "versions", dist, *_pip_platform_args(platform)], cwd=Path(tmp), timeout=180)
    match = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if proc.returncode or not match:
        return []
    return [v.strip() for v in match.group(1).split(",") if v.strip()]


def no_wheel_error(platform: DevicePlatform, requirements: Sequence[Requirement], pip_output: str) -> UsageError:
    """Which requirements have no wheel for this platform (each asked separately), why, and what does."""
    tags = platform.platform_tags()
    tried = f"{tags[0]} ... {tags[-1]}" if len(tags) > 2 else ", ".join(tags) or "no manylinux tag"
    if not tags:
        return UsageError(
            f"No wheels exist for the device's platform: {platform.describe()} (manylinux wheels need glibc 2.x "
            "on x86_64, i686, aarch64 or armv7l).",
            hint="Install the runtime on the device by other means (its OS packages) and set `python` for it in "
            "the inventory.")
    missing = [r for r in requirements if not available_versions(r.dist, platform)]
    if not missing:  # each has wheels, but not at the versions asked: name what pip named
        named = re.findall(r"No matching distribution found for ([^\s]+)", pip_output)
        what = ", ".join(named) or " ".join(r.pip for r in requirements)
        return UsageError(f"No wheel of {what} for the device's platform: {platform.describe()} (tried {tried}).",
                          hint="The target profile's version bounds exclude every build for this device; pick "
                          "another --runtime or --target.")
    newer = DevicePlatform(platform.arch, (3, 11), max(platform.glibc or (2, 36), (2, 36)))
    reasons = []
    for r in missing:
        if newer != platform and available_versions(r.dist, newer):
            reasons.append(f"{r.dist} (it has {platform.arch} wheels for newer Pythons/OS releases only)")
        else:
            reasons.append(f"{r.dist} (it publishes no {platform.arch} build)")
    alternatives = []
    if not any(r.name == "numpy" for r in missing):
        asked = {r.name for r in requirements}
        for spec in RUNTIME_SPECS:
            if spec.runtime in asked or spec.runtime == Runtime.TENSORFLOW:
                continue
            versions = available_versions(spec.distribution, platform)
            if versions:
                alternatives.append(f"{spec.runtime} {versions[0]}")
    if alternatives:
        hint = f"Runtimes with a wheel for this device: {', '.join(alternatives)}; pick one with --runtime."
    else:
        hint = ("No supported runtime publishes a wheel for this device; a newer OS (glibc) and Python on the "
                "device would widen the choice, or install a runtime from the OS's packages and set `python` "
                "for the device in the inventory.")
    if platform.arch in ("armv7l", "armv6l"):
        hint += (" On 32-bit Raspberry Pi OS, PyPI has no ARM wheels of these: install the 64-bit OS, or run "
                 "online setup with the device's pip configured for piwheels.org.")
    return UsageError(f"No wheel of {'; '.join(reasons)} for the device's platform: {platform.describe()} "
                      f"(tried {tried}).", hint=hint)


def download_wheels(
    platform: DevicePlatform, requirements: Sequence[Requirement], *, cache_root: Path | None = None,
    log: Log | None = None,
) -> WheelSet:
    """``pip download`` the requirements (and pip itself) for ``platform`` into the host cache.

    The package index is asked first (the cache dir doubles as pip's destination, so wheels already there are
    not fetched again); when that fails the cache alone is tried (``--no-index``), which lets a host without
    internet provision a device it provisioned before.
    """
    if not platform.platform_tags():
        raise no_wheel_error(platform, requirements, "")
    directory = (cache_root or wheel_cache_root()) / platform.key
    directory.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"downloading wheels for {platform.describe()} into {directory}")
    bare = _no_deps_wheels(platform, requirements, directory)
    specs = ["pip", *(r.pip for r in requirements if not r.without_deps)]
    base = ["download", *_pip_platform_args(platform), "-d", str(directory), *specs]
    proc = _run_pip(base, cwd=directory)
    cache_only = False
    if proc.returncode:
        first = proc
        proc = _run_pip([*base[:1], "--no-index", "--find-links", str(directory), *base[1:]], cwd=directory)
        cache_only = True
        if proc.returncode:
            output = first.stdout + first.stderr
            if "No matching distribution" in output or "ResolutionImpossible" in output:
                if "ResolutionImpossible" in output and "No matching distribution" not in output:
                    raise UsageError(
                        f"The runtimes asked for need conflicting packages on {platform.describe()}: "
                        f"{' '.join(specs[1:])}.", hint="Ask for fewer runtimes at once (--runtime).")
                raise no_wheel_error(platform, requirements, output)
            tail = "\n".join(output.strip().splitlines()[-3:])
            raise DeviceError(f"pip download failed on this machine: {tail}",
                              hint="Check this machine's access to the package index (or its pip config).")
    files = []
    for line in proc.stdout.splitlines():
        match = _SAVED.match(line)
        if match:
            path = Path(match.group(1))
            files.append(path if path.is_absolute() else directory / path.name)
    files = sorted({f.resolve() for f in [*files, *bare]})
    pip_wheels = [f for f in files if f.name.startswith("pip-")]
    if not files or not pip_wheels:
        raise DeviceError(f"pip download reported no wheels for {platform.describe()}.",
                          hint="Run with --debug and check this machine's pip configuration.")
    return WheelSet(platform, directory, tuple(files), pip_wheels[0], cache_only)


def _no_deps_wheels(platform: DevicePlatform, requirements: Sequence[Requirement], directory: Path) -> list[Path]:
    """The wheels of the ``without_deps`` requirements alone (``--no-deps``; their runtime needs are listed in
    their ``RuntimeSpec.requirements``)."""
    wheels = []
    for requirement in (r for r in requirements if r.without_deps):
        args = ["download", *_pip_platform_args(platform), "--no-deps", "-d", str(directory), requirement.pip]
        proc = _run_pip(args, cwd=directory)
        if proc.returncode:
            proc = _run_pip([*args[:1], "--no-index", "--find-links", str(directory), *args[1:]], cwd=directory)
        saved = [Path(m.group(1)) for m in map(_SAVED.match, proc.stdout.splitlines()) if m]
        if proc.returncode or not saved:
            raise no_wheel_error(platform, [requirement], proc.stdout + proc.stderr)
        wheels.append(saved[0] if saved[0].is_absolute() else directory / saved[0].name)
    return wheels
