"""Provision a device's inference runtimes: ``edgetk devices setup`` (issue 9).

A device needs numpy and the runtimes its bundles use, at versions its target profile allows
(:attr:`toolkit.model.targets.TargetProfile.runtimes`). Setup creates (or reuses) a virtual environment on the device
(default ``<home>/venv``, ``<home>`` the toolkit's home on the device: ``~/.edgetk`` or the device's ``home``),
installs them there, and records the venv's python in ``<home>/config.json``
(``{"python": ...}``); :attr:`toolkit.delivery.deployment.Device.python` reads that file, so every later deploy, check
and probe runs the runner with it, unless the inventory entry names its own ``python``, which wins.

Two modes:

- online: pip runs ON the device (``python -m venv`` with ensurepip, then ``pip install --only-binary=:all:``);
- offline (``--offline``, devices without internet): the device is probed (arch, pointer width, glibc, Python
  version and ABI), ``pip download --only-binary=:all: --platform TAG... --python-version --implementation cp
  --abi`` runs ON THE HOST with every manylinux tag the device's glibc allows (pip matches tags exactly:
  tflite-runtime 2.14 for aarch64 exists only as ``manylinux_2_34``, numpy only as ``manylinux_2_17``), the
  wheels are cached on the host per platform (``$XDG_CACHE_HOME/edgetk/wheels/<platform>-<abi>/``), pushed over
  the same connection (SFTP) to ``<home>/wheels/<platform>-<abi>/`` (files already there with the same size
  are not sent again) and installed with ``--no-index --find-links``. The venv is made ``--without-pip`` and pip
  itself runs from its pushed wheel (``python pip-X.whl/pip install ...``, pip's documented bootstrap), so a
  device without ``python3-venv``/ensurepip works too.

A runtime with no wheel for the device (ai-edge-litert on armv7l, anything on an old Python) is refused
(:class:`~toolkit.errors.UsageError`, exit 2, like a bundle for another arch) with a message naming the
platform, the tags tried and the runtimes that do have a wheel there. Device commands that fail are
:class:`~toolkit.errors.DeviceError` (exit 4). Every device-side step is a command of the stdlib-only
``toolkit/device_side/device_setup.py`` (Python >= 3.6) run as ``python -c SOURCE COMMAND ARGS...``. The
wheels are :mod:`toolkit.delivery.wheels`'; what each runtime is, :mod:`toolkit.runtimes.spec`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.delivery.deployment import home_hint
from toolkit.delivery.pte_install import install_pte_runner
from toolkit.delivery.pte_runner import exporter_version
from toolkit.delivery.setup_steps import probe_script, run_json, setup_step
from toolkit.delivery.wheels import Log, Requirement, WheelSet, download_wheels, no_wheel_error
from toolkit.errors import DeviceError, UsageError
from toolkit.model.answers import SetupResult
from toolkit.model.platform import DevicePlatform, match_environment
from toolkit.model.device_records import CommandResult
from toolkit.model.vocabulary import RUNTIMES, TFLITE_RUNTIMES, Runtime
from toolkit.runtimes.spec import SPECS

if TYPE_CHECKING:
    from toolkit.delivery.deployment import Device
    from toolkit.model.targets import TargetProfile

FALLBACK_RUNTIMES = (Runtime.LITERT.value, Runtime.ONNXRUNTIME.value)


def platform_from_probe(doc: dict[str, Any]) -> DevicePlatform:  # Any: JSON
    """A :class:`DevicePlatform` from the device probe's document (``toolkit/device_side/device_probe.py``)."""
    return DevicePlatform.from_probe(doc)


# ------------------------------------------------------------------------------------------- plan


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


def default_runtimes(profile: TargetProfile | None) -> tuple[str, ...]:
    """The profile's first TFLite runtime plus onnxruntime when listed (installing two TFLite runtimes side by
    side pulls conflicting numpy versions); litert + onnxruntime without a profile. ``executorch`` only when asked
    (``--runtime executorch``), even where the profile lists it: its native runner needs a C++ compiler, on this
    machine (a cross compiler for another arch) or on the device (:mod:`toolkit.delivery.pte_runner`)."""
    if profile is None:
        return FALLBACK_RUNTIMES
    names = list(profile.runtime_names)
    chosen = [n for n in names if n in TFLITE_RUNTIMES][:1]
    if Runtime.ONNXRUNTIME in names:
        chosen.append(Runtime.ONNXRUNTIME.value)
    return tuple(chosen) or FALLBACK_RUNTIMES


def left_out(profile: TargetProfile | None, runtimes: Sequence[str]) -> list[str]:
    """Notes on the runtimes the profile lists that a plain setup did not install (executorch: see above)."""
    if profile is None or Runtime.EXECUTORCH not in profile.runtime_names or Runtime.EXECUTORCH in runtimes:
        return []
    return [f"the profile {profile.name} lists executorch for its .pte artifacts; it is installed only with "
            "--runtime executorch (the executorch wheel without torch, and the native .pte runner built for the "
            "device, which needs a C++ compiler here or there). Without it the device reports its .pte artifacts "
            "as missing_runtime and measures the rest"]


def plan_requirements(runtimes: Sequence[str], profile: TargetProfile | None) -> tuple[list[Requirement], list[str]]:
    """numpy + the runtimes with the profile's bounds, + what they need undeclared; notes for runtimes the profile
    does not list."""
    notes: list[str] = []
    reqs = []
    extras: list[str] = []
    for name in runtimes:
        if name not in RUNTIMES:
            raise UsageError(f"Unknown runtime {name!r}.", hint=f"Use one of: {', '.join(RUNTIMES)}.")
        runtime = SPECS[Runtime(name)]
        requirement = profile.runtime(name) if profile is not None else None
        spec = specifier_for(requirement.min_version, requirement.max_version) if requirement else ""
        if name == Runtime.EXECUTORCH and exporter_version():  # the exporter's release: no other is guaranteed
            spec = f"=={exporter_version()}"  # to load its programs (docs/devices.md)
        if profile is not None and requirement is None:
            notes.append(f"the profile {profile.name} does not list {name}; installing the newest release that "
                         "has a wheel for the device")
        reqs.append(Requirement(name, runtime.distribution, spec, without_deps=runtime.without_deps))
        extras.extend(runtime.requirements)
    split = [_split_requirement(e) for e in dict.fromkeys(extras)]
    numpy_spec = ",".join(spec for dist, spec in split if dist == "numpy")
    reqs += [Requirement(dist, dist, spec) for dist, spec in split if dist != "numpy"]
    return [Requirement("numpy", "numpy", numpy_spec), *reqs], notes


def _split_requirement(text: str) -> tuple[str, str]:
    """``torch==2.13.0`` -> (``torch``, ``==2.13.0``): a runtime row's requirement as name and pip specifier."""
    name = re.split(r"[<>=!~\s]", text, maxsplit=1)[0]
    return name, text[len(name):].strip()


# ------------------------------------------------------------------------------------------- setup


@dataclass(frozen=True)
class SetupOptions:
    runtimes: tuple[str, ...] = ()
    offline: bool = False
    venv: str | None = None  # None: <home>/venv
    target: str | None = None
    cache_root: Path | None = None


def base_python(device: Device) -> str:
    """The interpreter a venv is made from: the inventory's ``python`` if any, else python3 (this very one
    on ``local``)."""
    return str(device.helper_python)


def probe_platform(device: Device) -> tuple[DevicePlatform, dict[str, Any]]:  # Any: JSON
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


def choose_profile(device: Device, probe: dict[str, Any], target: str | None) -> TargetProfile | None:
    """``--target``, else the inventory's ``target``, else the shipped profile matching the probe; None when
    none matches (setup then installs the fallback runtimes unbounded). Any: the probe's JSON."""
    from toolkit.model.targets import get_profile

    name = target or device.spec.target
    if name:
        return get_profile(name)
    try:
        name = match_environment(probe)
    except UsageError:
        return None
    return get_profile(name)


def _venv_state(device: Device, python: str, venv: str) -> dict[str, Any]:  # Any: JSON
    """The venv as it is: ``ok`` is reused, ``broken`` removed (and made again), ``foreign`` refused."""
    state = run_json(device, setup_step(python, "venv-state", venv), "looking at the venv")
    if state["state"] == "foreign":
        raise UsageError(f"{device.spec.name}: {state['venv']} exists and is not a virtual environment.",
                         hint="Pass another --venv PATH, or remove that directory on the device.")
    if state["state"] == "broken":
        device.conn.run(setup_step(python, "remove-venv", venv), timeout=300)
    return state


def _check_writable(device: Device, python: str, places: dict[str, str], *, venv: str | None) -> None:
    """Refuse before anything is downloaded or made when a place setup writes (``places``: path -> what goes
    there) cannot be written, or when the ``venv`` to make is on a filesystem mounted noexec (the runtimes'
    native libraries could not load from there)."""
    state = run_json(device, setup_step(python, "writable", *places), "checking where setup writes")
    for where, entry in (state.get("dirs") or {}).items():
        what = places.get(where, where)
        if not entry.get("ok"):
            raise DeviceError(f"{device.spec.name}: cannot write {what} to {where} ({entry.get('error')}).",
                              hint=home_hint(device.spec.name, str(entry.get("error"))))
        if entry.get("noexec") and where == venv:
            raise DeviceError(f"{device.spec.name}: {where} is on a filesystem mounted noexec: the runtimes' native "
                              "libraries cannot load from there.",
                              hint="Put the toolkit's home on a filesystem without noexec (the inventory's `home`, "
                              "--device-home) or pass --venv PATH on one; `edgetk devices probe` lists the mounts.")


def _make_venv(device: Device, python: str, venv: str, *, with_pip: bool) -> None:
    """``python -m venv``; when it fails, the half-made venv is removed (a venv without pip would be reused and
    fail later with "No module named pip") and the error names the fix."""
    argv = [python, "-m", "venv", *([] if with_pip else ["--without-pip"]), venv]
    result = device.conn.run(argv, timeout=600)
    if not result.ok:
        device.conn.run(setup_step(python, "remove-venv", venv), timeout=300)
        # Debian's python3 without python3-venv prints its explanation on stdout, not stderr
        output = f"{result.stderr}\n{result.stdout}"
        if with_pip and "ensurepip" in output:
            raise DeviceError(
                f"{device.spec.name}: could not create the venv {venv}: the device's Python has no ensurepip "
                "(Debian and Raspberry Pi OS ship it in the python3-venv package).",
                hint="Install it on the device (sudo apt install python3-venv), or run setup with --offline, "
                "which pushes pip from this machine and needs no ensurepip.")
        lines = result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["no output"]
        raise DeviceError(f"{device.spec.name}: could not create the venv {venv} ({lines[-1][:300]}).",
                          hint="Check the path and the free disk on the device.")


def wheels_dir(device: Device) -> str:
    """Where pushed wheels wait on the device: ``<home>/wheels``."""
    return f"{device.base}/wheels"


def _push_wheels(device: Device, python: str, wheels: WheelSet, log: Log | None) -> tuple[str, int, int]:
    remote_dir = f"{wheels_dir(device)}/{wheels.platform.key}"
    present = run_json(device, setup_step(python, "list", remote_dir), "listing the wheels")
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


def _pip_failure(device: Device, result: CommandResult, requirements: Sequence[Requirement], platform: DevicePlatform) -> Exception:
    output = result.stdout + result.stderr
    if "No matching distribution" in output:
        return no_wheel_error(platform, requirements, output)
    tail = "\n".join(output.strip().splitlines()[-3:])[-600:]
    return DeviceError(f"{device.spec.name}: pip install failed on the device: {tail}",
                       hint="Check the device's disk space and network (or use --offline).")


@dataclass(frozen=True)
class _Installer:
    """How pip runs in the venv: ``install`` (its options), ``first`` (the first install's argv, which in offline
    mode also installs pip from the pushed wheel), and what the wheels' push sent."""

    install: tuple[str, ...]
    first: tuple[str, ...]
    sent: int = 0
    sent_bytes: int = 0


def _installer(device: Device, options: SetupOptions, platform: DevicePlatform, requirements: Sequence[Requirement],
               venv: tuple[str, str, bool], notes: list[str], log: Log | None) -> _Installer:
    """Make the venv where it is not reused; offline, download and push the wheels first."""
    base, venv_python, reused = venv
    where = options.venv
    assert where is not None  # setup_device fills in <home>/venv
    quiet = ("--only-binary=:all:", "--disable-pip-version-check", "--no-input", "-q")
    if not options.offline:
        if not reused:
            _make_venv(device, base, where, with_pip=True)
        online = (venv_python, "-m", "pip", "install", *quiet)
        return _Installer(online, online)
    wheels = download_wheels(platform, requirements, cache_root=options.cache_root, log=log)
    if wheels.from_cache_only:
        notes.append("the package index was not reachable from this machine; used the wheel cache")
    if not reused:
        _make_venv(device, base, where, with_pip=False)
    remote_dir, sent, sent_bytes = _push_wheels(device, base, wheels, log)
    install = (venv_python, f"{remote_dir}/{wheels.pip_wheel.name}/pip", "install", "--no-index", "--find-links",
               remote_dir, *quiet)
    return _Installer(install, (*install, "pip"), sent, sent_bytes)


def _install(device: Device, installer: _Installer, requirements: Sequence[Requirement],
             platform: DevicePlatform) -> None:
    """pip install the requirements (those ``without_deps`` in a second ``--no-deps`` run)."""
    result = device.conn.run([*installer.first, *(r.pip for r in requirements if not r.without_deps)],
                             timeout=1800)
    bare = [r.pip for r in requirements if r.without_deps]
    if result.ok and bare:
        result = device.conn.run([*installer.install, "--no-deps", *bare], timeout=1800)
    if not result.ok:
        raise _pip_failure(device, result, requirements, platform)


def _verify(device: Device, venv_python: str, requirements: Sequence[Requirement]) -> dict[str, str | None]:
    """Import each runtime in the venv (proof it loads): {requirement name: installed version}."""
    checks = [f"{SPECS[Runtime(r.name)].verify_module if r.name in RUNTIMES else r.name}={r.dist}"
              for r in requirements]
    verified = run_json(device, setup_step(venv_python, "verify", *checks), "importing the runtimes", timeout=600)
    errors = verified.get("errors") or {}
    if errors:
        dist, why = next(iter(errors.items()))
        raise DeviceError(f"{device.spec.name}: {dist} was installed but does not import: {why}",
                          hint=import_failure_hint(str(why)))
    return {r.name: (verified.get("versions") or {}).get(r.dist) for r in requirements}


def import_failure_hint(why: str) -> str:
    """What to do about a runtime that installed but does not import: a missing module or shared library is
    named as what is missing (executorch without its torch, a CUDA build of torch without its CUDA libraries);
    anything else is most often a wheel built for a newer CPU or OS than the device's."""
    module = re.search(r"No module named '([^']+)'", why)
    if module:
        return (f"It needs the Python module {module.group(1)!r}, which is not in the device's venv: install it "
                "there, or run setup again so its requirements are installed with it.")
    library = re.search(r"([\w.+-]+\.so[\w.]*): cannot open shared object file", why)
    if library:
        return (f"It needs the shared library {library.group(1)}, which the device does not have: install the "
                "package that provides it, or a build of the runtime that does not link it.")
    return "The wheel may need a newer CPU or OS than the device has; try another --runtime."


def setup_device(device: Device, options: SetupOptions, *, log: Log | None = None) -> SetupResult:
    """Create or reuse the venv, install numpy + runtimes, verify they import, record the venv's python."""
    started = time.perf_counter()
    platform, probe = probe_platform(device)
    profile = choose_profile(device, probe, options.target)
    runtimes = tuple(dict.fromkeys(options.runtimes)) or default_runtimes(profile)
    requirements, notes = plan_requirements(runtimes, profile)
    notes += left_out(profile, runtimes)
    base = base_python(device)
    options = replace(options, venv=options.venv or f"{device.base}/venv")
    assert options.venv is not None
    state = _venv_state(device, base, options.venv)
    fresh = state["state"] != "ok"
    _check_writable(device, base, {device.base: "the toolkit's files", **({options.venv: "the venv"} if fresh else {}),
                                   **({wheels_dir(device): "the wheels"} if options.offline else {})},
                    venv=options.venv if fresh else None)
    if state["state"] == "broken":
        notes.append(f"{state['venv']} was broken (its python did not run); recreated it")
    reused = state["state"] == "ok"
    venv_python = str(state["python"])
    installer = _installer(device, options, platform, requirements, (base, venv_python, reused), notes, log)
    if log:
        log(f"installing {' '.join(r.pip for r in requirements)} into {state['venv']}")
    _install(device, installer, requirements, platform)
    installed = _verify(device, venv_python, requirements)
    if Runtime.EXECUTORCH in runtimes:
        notes.append(install_pte_runner(device, venv_python, platform.arch, str(installed[Runtime.EXECUTORCH.value]),
                                        log))
    run_json(device, setup_step(base, "record", venv_python, device.base),
              f"recording the venv in {device.base}/config.json")
    if device.spec.python:
        notes.append(f"the inventory names python = {device.spec.python!r}, which wins over this venv for "
                     "deploys and checks; remove it there to use the venv")
    return SetupResult(
        device=device.spec.name, mode="offline" if options.offline else "online", python=venv_python,
        venv_reused=reused, platform=platform.describe(), profile=profile.name if profile is not None else None,
        installed=installed, wheels_sent=installer.sent, bytes_sent=installer.sent_bytes,
        seconds=time.perf_counter() - started, notes=tuple(notes),
    )
