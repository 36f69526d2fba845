"""Provision a device's inference runtimes: ``edgetk devices setup`` (issue 9).

A device needs numpy and the runtimes its bundles use, at versions its target profile allows
(:attr:`toolkit.model.targets.TargetProfile.runtimes`). Setup creates (or reuses) a virtual environment on the device
(default ``~/.edgetk/venv``), installs them there, and records the venv's python in ``~/.edgetk/config.json``
(``{"python": ...}``); :attr:`toolkit.delivery.deployment.Device.python` reads that file, so every later deploy, check
and probe runs the runner with it, unless the inventory entry names its own ``python``, which wins.

Two modes:

- online: pip runs ON the device (``python -m venv`` with ensurepip, then ``pip install --only-binary=:all:``);
- offline (``--offline``, devices without internet): the device is probed (arch, pointer width, glibc, Python
  version and ABI), ``pip download --only-binary=:all: --platform TAG... --python-version --implementation cp
  --abi`` runs ON THE HOST with every manylinux tag the device's glibc allows (pip matches tags exactly:
  tflite-runtime 2.14 for aarch64 exists only as ``manylinux_2_34``, numpy only as ``manylinux_2_17``), the
  wheels are cached on the host per platform (``$XDG_CACHE_HOME/edgetk/wheels/<platform>-<abi>/``), pushed over
  the same connection (SFTP) to ``~/.edgetk/wheels/<platform>-<abi>/`` (files already there with the same size
  are not sent again) and installed with ``--no-index --find-links``. The venv is made ``--without-pip`` and pip
  itself runs from its pushed wheel (``python pip-X.whl/pip install ...``, pip's documented bootstrap), so a
  device without ``python3-venv``/ensurepip works too.

A runtime with no wheel for the device (ai-edge-litert on armv7l, anything on an old Python) is refused
(:class:`~toolkit.errors.UsageError`, exit 2, like a bundle for another arch) with a message naming the
platform, the tags tried and the runtimes that do have a wheel there. Device commands that fail are
:class:`~toolkit.errors.DeviceError` (exit 4). Every device-side step is a small stdlib-only script (Python
>= 3.6) run as ``python -c SCRIPT ARGS...``; the connection quotes each argument for the remote shell.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.errors import DeviceError, UsageError
from toolkit.model.platform import DevicePlatform, match_environment
from toolkit.model.vocabulary import RUNTIMES, TFLITE_RUNTIMES

DEFAULT_VENV = ".edgetk/venv"
CONFIG_FILE = ".edgetk/config.json"
REMOTE_WHEELS = ".edgetk/wheels"

# runtime name -> (pip distribution, module to import to prove it loads)
DISTRIBUTIONS: dict[str, tuple[str, str]] = {
    "litert": ("ai-edge-litert", "ai_edge_litert.interpreter"),
    "tflite-runtime": ("tflite-runtime", "tflite_runtime.interpreter"),
    "tensorflow": ("tensorflow", "tensorflow"),
    "onnxruntime": ("onnxruntime", "onnxruntime"),
    # ExecuTorch's Python runtime imports torch: pip pulls torch with it (on x86_64 PyPI's torch is the CUDA
    # build; aarch64 wheels are CPU-only)
    "executorch": ("executorch", "executorch.runtime"),
}
# Extra requirements a runtime needs but does not declare: tflite-runtime 2.14 was built against numpy 1.x,
# declares only numpy>=1.23.2 and fails to import under numpy 2.
# ExecuTorch is installed without its declared dependencies (NO_DEPS_DISTS): they are the exporter's tooling
# (hydra-core needs antlr4-python3-runtime, which has no wheel; coremltools has no aarch64 wheel and pip, asked
# from an x86_64 host with --platform, evaluates its x86_64 marker for this host), while its Python runtime
# imports torch (undeclared), ruamel.yaml, flatbuffers, and for ETDump profiles tabulate and pandas: measured in
# a bare venv, those are what executorch.runtime, the bundled-program check and devtools' Inspector import.
EXTRA_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "tflite-runtime": ("numpy<2",),
    "executorch": ("torch", "ruamel.yaml", "flatbuffers", "tabulate", "pandas"),
}
NO_DEPS_DISTS = frozenset({"executorch"})
FALLBACK_RUNTIMES = ("litert", "onnxruntime")


Log = Callable[[str], None]


def platform_from_probe(doc: dict[str, Any]) -> DevicePlatform:
    """A :class:`DevicePlatform` from the device probe's document (``toolkit/device_side/device_probe.py``)."""
    return DevicePlatform.from_probe(doc)


# ------------------------------------------------------------------------------------------- device side


def probe_script() -> str:
    """The device probe's source, run as ``python -c`` (setup runs before anything is installed there)."""
    from toolkit.device_side import PROBE_FILE, source_path

    return source_path(PROBE_FILE).read_text()


# argv: VENV_DIR. Prints {"state": "ok"|"broken"|"absent"|"foreign", "python": path}
VENV_STATE_SCRIPT = r"""
import json, os, subprocess, sys
venv = os.path.abspath(os.path.expanduser(sys.argv[1]))
python = os.path.join(venv, "bin", "python")
if not os.path.exists(venv):
    state = "absent"
elif not os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
    state = "foreign"
else:
    try:
        state = "ok" if subprocess.call([python, "-c", "pass"]) == 0 else "broken"
    except OSError:
        state = "broken"
print(json.dumps({"state": state, "python": python, "venv": venv}))
"""

# argv: VENV_DIR. Removes a broken venv (only a directory holding pyvenv.cfg).
REMOVE_VENV_SCRIPT = r"""
import os, shutil, sys
venv = os.path.abspath(os.path.expanduser(sys.argv[1]))
if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
    shutil.rmtree(venv)
"""

# argv: DIR. Prints {file name: size} of the regular files in DIR (creating it).
LIST_SCRIPT = r"""
import json, os, sys
d = sys.argv[1]
if not os.path.isdir(d):
    os.makedirs(d, 0o755)
print(json.dumps({n: os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)
                  if os.path.isfile(os.path.join(d, n))}))
"""

# argv: PYTHON. Merges {"python": PYTHON} into ~/.edgetk/config.json atomically.
RECORD_SCRIPT = r"""
import json, os, sys
path = os.path.join(os.path.expanduser("~"), ".edgetk", "config.json")
if not os.path.isdir(os.path.dirname(path)):
    os.makedirs(os.path.dirname(path), 0o755)
try:
    with open(path) as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        data = {}
except (OSError, ValueError):
    data = {}
data["python"] = sys.argv[1]
tmp = path + ".tmp"
with open(tmp, "w") as handle:
    json.dump(data, handle, indent=2)
os.replace(tmp, path)
print(json.dumps(data))
"""

# argv: MODULE=DIST... Imports each module (proof it loads) and prints {dist: version or null, "errors": {}}.
VERIFY_SCRIPT = r"""
import importlib, json, sys
try:
    from importlib import metadata
except ImportError:
    metadata = None
out, errors = {}, {}
for item in sys.argv[1:]:
    module, dist = item.split("=", 1)
    try:
        importlib.import_module(module)
    except Exception as exc:
        errors[dist] = "%s: %s" % (type(exc).__name__, exc)
        out[dist] = None
        continue
    try:
        out[dist] = metadata.version(dist) if metadata else "unknown"
    except Exception:
        out[dist] = "unknown"
print(json.dumps({"versions": out, "errors": errors}))
"""


# ------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Requirement:
    """One thing to install: a runtime (or numpy/pip) with the pip specifier the profile allows."""

    name: str
    dist: str
    specifier: str = ""

    @property
    def pip(self) -> str:
        return f"{self.dist}{self.specifier}"


def _next_prefix(version: str) -> str:
    parts = [int(p) for p in version.split(".")]
    parts[-1] += 1
    return ".".join(str(p) for p in parts)


def specifier_for(min_version: str | None, max_version: str | None) -> str:
    """A profile's inclusive bounds as a pip specifier; ``max_version`` is a prefix (``2.14`` admits 2.14.x)."""
    parts = []
    if min_version:
        parts.append(f">={min_version}")
    if max_version:
        parts.append(f"<{_next_prefix(max_version)}")
    return ",".join(parts)


def default_runtimes(profile: Any | None) -> tuple[str, ...]:
    """The profile's first TFLite runtime plus onnxruntime when listed (installing two TFLite runtimes side by
    side pulls conflicting numpy versions); litert + onnxruntime without a profile. ``executorch`` only when asked
    (``--runtime executorch``): it brings torch, and PyPI's aarch64 torch (2.14.1) pulls CUDA libraries, 3.2 GB
    of wheels for an aarch64 device in all (measured), where a Pi needs the CPU build."""
    if profile is None:
        return FALLBACK_RUNTIMES
    names = list(profile.runtime_names)
    chosen = [n for n in names if n in TFLITE_RUNTIMES][:1]
    if "onnxruntime" in names:
        chosen.append("onnxruntime")
    return tuple(chosen) or FALLBACK_RUNTIMES


def plan_requirements(runtimes: Sequence[str], profile: Any | None) -> tuple[list[Requirement], list[str]]:
    """numpy + the runtimes with the profile's bounds; notes for runtimes the profile does not list."""
    notes: list[str] = []
    reqs = []
    extras: list[str] = []
    for name in runtimes:
        if name not in DISTRIBUTIONS:
            raise UsageError(f"Unknown runtime {name!r}.", hint=f"Use one of: {', '.join(RUNTIMES)}.")
        requirement = profile.runtime(name) if profile is not None else None
        spec = specifier_for(requirement.min_version, requirement.max_version) if requirement else ""
        if profile is not None and requirement is None:
            notes.append(f"the profile {profile.name} does not list {name}; installing the newest release that "
                         "has a wheel for the device")
        reqs.append(Requirement(name, DISTRIBUTIONS[name][0], spec))
        extras.extend(EXTRA_REQUIREMENTS.get(name, ()))
    numpy_spec = ",".join(e[len("numpy"):] for e in extras if e.startswith("numpy"))
    reqs += [Requirement(e, e, "") for e in dict.fromkeys(extras) if not e.startswith("numpy")]
    return [Requirement("numpy", "numpy", numpy_spec), *reqs], notes


# ------------------------------------------------------------------------------------------- host side wheels


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


def _no_wheel_error(platform: DevicePlatform, requirements: Sequence[Requirement], pip_output: str) -> UsageError:
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
        for runtime, (dist, _module) in DISTRIBUTIONS.items():
            if runtime in asked or runtime == "tensorflow":
                continue
            versions = available_versions(dist, platform)
            if versions:
                alternatives.append(f"{runtime} {versions[0]}")
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
        raise _no_wheel_error(platform, requirements, "")
    directory = (cache_root or wheel_cache_root()) / platform.key
    directory.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"downloading wheels for {platform.describe()} into {directory}")
    bare = _no_deps_wheels(platform, requirements, directory)
    specs = ["pip", *(r.pip for r in requirements if r.dist not in NO_DEPS_DISTS)]
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
                raise _no_wheel_error(platform, requirements, output)
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
    """The wheels of the ``NO_DEPS_DISTS`` requirements alone (``--no-deps``; their runtime needs are listed in
    ``EXTRA_REQUIREMENTS``)."""
    wheels = []
    for requirement in (r for r in requirements if r.dist in NO_DEPS_DISTS):
        args = ["download", *_pip_platform_args(platform), "--no-deps", "-d", str(directory), requirement.pip]
        proc = _run_pip(args, cwd=directory)
        if proc.returncode:
            proc = _run_pip([*args[:1], "--no-index", "--find-links", str(directory), *args[1:]], cwd=directory)
        saved = [Path(m.group(1)) for m in map(_SAVED.match, proc.stdout.splitlines()) if m]
        if proc.returncode or not saved:
            raise _no_wheel_error(platform, [requirement], proc.stdout + proc.stderr)
        wheels.append(saved[0] if saved[0].is_absolute() else directory / saved[0].name)
    return wheels


# ------------------------------------------------------------------------------------------- setup


@dataclass(frozen=True)
class SetupOptions:
    runtimes: tuple[str, ...] = ()
    offline: bool = False
    venv: str = DEFAULT_VENV
    target: str | None = None
    cache_root: Path | None = None


@dataclass(frozen=True)
class SetupResult:
    device: str
    mode: str
    python: str
    venv_reused: bool
    platform: str
    profile: str | None
    installed: dict[str, str | None]
    wheels_sent: int
    bytes_sent: int
    seconds: float
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "python": self.python, "venv_reused": self.venv_reused,
                "platform": self.platform, "profile": self.profile, "installed": dict(self.installed),
                "wheels_sent": self.wheels_sent, "bytes_sent": self.bytes_sent, "seconds": round(self.seconds, 2),
                "notes": list(self.notes)}


def _run_json(device: Any, argv: Sequence[str], what: str, *, timeout: float = 120.0) -> dict[str, Any]:
    result = device.conn.run(list(argv), timeout=timeout)
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1]) if result.ok and result.stdout.strip() else None
    except (json.JSONDecodeError, IndexError):
        data = None
    if not isinstance(data, dict):
        tail = (result.stderr.strip().splitlines() or [result.stdout.strip() or "no output"])[-1][:300]
        raise DeviceError(f"{device.spec.name}: {what} failed on the device ({tail}).")
    return data


def base_python(device: Any) -> str:
    """The interpreter a venv is made from: the inventory's ``python`` if any, else python3 (this very one
    on ``local``)."""
    return str(device.helper_python)


def probe_platform(device: Any) -> tuple[DevicePlatform, dict[str, Any]]:
    """Arch, pointer width, glibc, Python and ABI of the device's base python (nothing needs installing)."""
    python = base_python(device)
    result = device.conn.run([python, "-c", probe_script()], timeout=120)
    if not result.ok:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise DeviceError(f"{device.spec.name}: cannot run {python!r} on the device ({tail}).",
                          hint="Install python3 (>= 3.6) there, or set `python` for it in the inventory.")
    try:
        doc = json.loads(result.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise DeviceError(f"{device.spec.name}: the setup probe printed no JSON.") from None
    return platform_from_probe(doc), doc


def choose_profile(device: Any, probe: dict[str, Any], target: str | None) -> Any | None:
    """``--target``, else the inventory's ``target``, else the shipped profile matching the probe; None when
    none matches (setup then installs the fallback runtimes unbounded)."""
    from toolkit.model.targets import get_profile

    name = target or device.spec.target
    if name:
        return get_profile(name)
    try:
        name = match_environment(probe)
    except UsageError:
        return None
    return get_profile(name)


def _venv_state(device: Any, python: str, venv: str) -> dict[str, Any]:
    return _run_json(device, [python, "-c", VENV_STATE_SCRIPT, venv], "looking at the venv")


def _make_venv(device: Any, python: str, venv: str, *, with_pip: bool) -> None:
    argv = [python, "-m", "venv", *([] if with_pip else ["--without-pip"]), venv]
    result = device.conn.run(argv, timeout=600)
    if not result.ok:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1][:300]
        hint = ("Install the OS's venv package there (Debian/Raspberry Pi OS: sudo apt install python3-venv), "
                "or use --offline, which needs no ensurepip." if with_pip and "ensurepip" in result.stderr
                else "Check the path and the free disk on the device.")
        raise DeviceError(f"{device.spec.name}: could not create the venv {venv} ({tail}).", hint=hint)


def _push_wheels(device: Any, python: str, wheels: WheelSet, log: Log | None) -> tuple[str, int, int]:
    remote_dir = f"{REMOTE_WHEELS}/{wheels.platform.key}"
    present = _run_json(device, [python, "-c", LIST_SCRIPT, remote_dir], "listing the wheels")
    sent = sent_bytes = 0
    for path in wheels.files:
        size = path.stat().st_size
        if present.get(path.name) == size:
            continue
        if log:
            log(f"sending {path.name} ({size / 1e6:.1f} MB)")
        device.conn.put(path, f"{remote_dir}/{path.name}")
        sent += 1
        sent_bytes += size
    return remote_dir, sent, sent_bytes


def _pip_failure(device: Any, result: Any, requirements: Sequence[Requirement], platform: DevicePlatform) -> Exception:
    output = result.stdout + result.stderr
    if "No matching distribution" in output:
        return _no_wheel_error(platform, requirements, output)
    tail = "\n".join(output.strip().splitlines()[-3:])[-600:]
    return DeviceError(f"{device.spec.name}: pip install failed on the device: {tail}",
                       hint="Check the device's disk space and network (or use --offline).")


def setup_device(device: Any, options: SetupOptions, *, log: Log | None = None) -> SetupResult:
    """Create or reuse the venv, install numpy + runtimes, verify they import, record the venv's python."""
    started = time.perf_counter()
    platform, probe = probe_platform(device)
    profile = choose_profile(device, probe, options.target)
    runtimes = tuple(dict.fromkeys(options.runtimes)) or default_runtimes(profile)
    requirements, notes = plan_requirements(runtimes, profile)
    base = base_python(device)
    venv = options.venv
    state = _venv_state(device, base, venv)
    if state["state"] == "foreign":
        raise UsageError(f"{device.spec.name}: {state['venv']} exists and is not a virtual environment.",
                         hint="Pass another --venv PATH, or remove that directory on the device.")
    if state["state"] == "broken":
        notes.append(f"{state['venv']} was broken (its python did not run); recreated it")
        device.conn.run([base, "-c", REMOVE_VENV_SCRIPT, venv], timeout=300)
    reused = state["state"] == "ok"
    venv_python = str(state["python"])
    sent = sent_bytes = 0
    if options.offline:
        wheels = download_wheels(platform, requirements, cache_root=options.cache_root, log=log)
        if wheels.from_cache_only:
            notes.append("the package index was not reachable from this machine; used the wheel cache")
        if not reused:
            _make_venv(device, base, venv, with_pip=False)
        remote_dir, sent, sent_bytes = _push_wheels(device, base, wheels, log)
        pip = [venv_python, f"{remote_dir}/{wheels.pip_wheel.name}/pip"]
        install = [*pip, "install", "--no-index", "--find-links", remote_dir, "--only-binary=:all:",
                   "--disable-pip-version-check", "--no-input", "-q"]
        argv = [*install, "pip"]
    else:
        if not reused:
            _make_venv(device, base, venv, with_pip=True)
        install = [venv_python, "-m", "pip", "install", "--only-binary=:all:", "--disable-pip-version-check",
                   "--no-input", "-q"]
        argv = list(install)
    if log:
        log(f"installing {' '.join(r.pip for r in requirements)} into {state['venv']}")
    result = device.conn.run([*argv, *(r.pip for r in requirements if r.dist not in NO_DEPS_DISTS)], timeout=1800)
    bare = [r.pip for r in requirements if r.dist in NO_DEPS_DISTS]
    if result.ok and bare:
        result = device.conn.run([*install, "--no-deps", *bare], timeout=1800)
    if not result.ok:
        raise _pip_failure(device, result, requirements, platform)
    checks = [f"{DISTRIBUTIONS[r.name][1] if r.name in DISTRIBUTIONS else r.name}={r.dist}" for r in requirements]
    verified = _run_json(device, [venv_python, "-c", VERIFY_SCRIPT, *checks], "importing the runtimes",
                         timeout=600)
    errors = verified.get("errors") or {}
    if errors:
        dist, why = next(iter(errors.items()))
        raise DeviceError(f"{device.spec.name}: {dist} was installed but does not import: {why}",
                          hint="The wheel may need a newer CPU or OS than the device has; try another --runtime.")
    _run_json(device, [base, "-c", RECORD_SCRIPT, venv_python], "recording the venv in ~/.edgetk/config.json")
    if device.spec.python:
        notes.append(f"the inventory names python = {device.spec.python!r}, which wins over this venv for "
                     "deploys and checks; remove it there to use the venv")
    installed = {r.name: (verified.get("versions") or {}).get(r.dist) for r in requirements}
    return SetupResult(
        device=device.spec.name, mode="offline" if options.offline else "online", python=venv_python,
        venv_reused=reused, platform=platform.describe(), profile=profile.name if profile is not None else None,
        installed=installed, wheels_sent=sent, bytes_sent=sent_bytes, seconds=time.perf_counter() - started,
        notes=tuple(notes),
    )
