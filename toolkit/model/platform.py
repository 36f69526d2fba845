"""What a device is, host side: the one arch table, ARM core names, the wheel platform, the matching profile.

The device reports raw facts (``toolkit/device_side/device_probe.py``: ``uname -m``, cpuinfo, the device-tree
model, glibc, the interpreter's ABI); this module is the one place that names them. ``armv8l`` is a 32-bit ARM
userland on an ARMv8 core (``linux32``): it runs armv7l code and wheels, never aarch64 ones, so it is
``armv7l`` here for deploy, probe and setup alike. stdlib only; nothing here imports numpy or a framework.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

from toolkit.errors import DeviceError, UsageError
from toolkit.model.records import JsonObject
from toolkit.model.vocabulary import AcceleratorKind

ARCH_ALIASES: Mapping[str, str] = {
    "amd64": "x86_64", "x64": "x86_64", "x86-64": "x86_64",
    "arm64": "aarch64", "armv8": "aarch64",
    "armv8l": "armv7l", "armhf": "armv7l", "armv7": "armv7l", "arm": "armv7l",
    "i686": "x86", "i386": "x86",
}

# The arches a profile may name (what normalize_arch returns for the devices this toolkit supports).
ARCHES: tuple[str, ...] = ("aarch64", "armv7l", "x86_64")
ACCELERATOR_KINDS: tuple[str, ...] = AcceleratorKind.values()

# ONNX Runtime's execution provider names (a misspelt one is only a warning in ORT, then it silently runs on CPU).
EXECUTION_PROVIDERS: tuple[str, ...] = (
    "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider",
    "XnnpackExecutionProvider", "ACLExecutionProvider", "ArmNNExecutionProvider", "DnnlExecutionProvider",
    "OpenVINOExecutionProvider", "QNNExecutionProvider", "RknpuExecutionProvider", "ROCMExecutionProvider",
    "MIGraphXExecutionProvider", "CoreMLExecutionProvider", "NnapiExecutionProvider", "DmlExecutionProvider",
    "VitisAIExecutionProvider", "WebGpuExecutionProvider",
)

# /proc/cpuinfo's "CPU part" of ARM cores -> their names.
ARM_CPU_PARTS: Mapping[str, str] = {
    "0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd41": "Cortex-A78", "0xd42": "Cortex-A78AE",
    "0xd4b": "Cortex-A78C",
}

_X86_CPU = re.compile(r"intel|amd|epyc|xeon|ryzen|core\(tm\)|genuineintel|authenticamd|x86|qemu virtual cpu")

# The oldest glibc that manylinux wheels exist for, per arch (manylinux1 = 2.5, manylinux2014 = 2.17).
_MIN_GLIBC = {"x86_64": 5, "i686": 5, "aarch64": 17, "armv7l": 17, "ppc64le": 17, "s390x": 17}
_LEGACY_ALIASES = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def normalize_arch(arch: str) -> str:
    """``uname -m`` / Debian / Docker spellings -> aarch64, armv7l, x86_64 (others lower-cased as they are)."""
    lowered = arch.strip().lower()
    return ARCH_ALIASES.get(lowered, lowered)


def accepted_arches(wanted: str | None) -> list[str]:
    """Every ``uname -m`` spelling that :func:`normalize_arch` maps to ``wanted`` (empty: any arch)."""
    if not wanted:
        return []
    target = normalize_arch(wanted)
    return sorted({target, *(alias for alias, arch in ARCH_ALIASES.items() if arch == target)})


def cpu_name(cpu_model: str | None, cpu_part: str | None = None) -> str | None:
    """The CPU's name: cpuinfo's model name, else the ARM core its "CPU part" code stands for."""
    model = (cpu_model or "").strip()
    if model.lower() in ARM_CPU_PARTS:
        return ARM_CPU_PARTS[model.lower()]
    if model:
        return model
    part = (cpu_part or "").strip().lower()
    return ARM_CPU_PARTS.get(part, part or None)


@dataclass(frozen=True)
class BoardMatch:
    """A shipped profile's ``[match]`` table: the patterns (case-blind regular expressions) that pick it."""

    profile: str
    boards: tuple[str, ...]  # searched in the board's own name and the CPU's
    cores: tuple[str, ...]  # a CPU core that on its own names the board


@lru_cache(maxsize=1)
def board_matches() -> tuple[BoardMatch, ...]:
    """The ``[match]`` tables of the shipped profiles, by profile name (the profile schema checks them)."""
    import tomllib

    from toolkit.resources import targets_dir

    found = []
    for path in sorted(targets_dir().glob("*.toml")):
        with path.open("rb") as handle:
            match = tomllib.load(handle).get("match")
        if match:
            found.append(BoardMatch(path.stem, tuple(match.get("boards", ())), tuple(match.get("cores", ()))))
    return tuple(found)


def match_profile(*, arch: str, cpu_model: str | None, model_name: str | None = None,
                  cpu_part: str | None = None) -> str:
    """The shipped profile that best fits a probed device.

    ``model_name`` is the board's own name (``/proc/device-tree/model`` or cpuinfo's ``Model`` line, e.g.
    "Raspberry Pi 4 Model B Rev 1.4"); ``cpu_model`` the CPU's ("Cortex-A72", cpuinfo's "model name", or a
    "CPU part" such as "0xd08"), ``cpu_part`` cpuinfo's CPU part when known separately. A board is named only
    by those, never by the arch alone: each shipped profile's ``[match]`` table (:func:`board_matches`) names
    its board's names and, where one alone tells, its core (a Cortex-A53 is the Pi 3B, the Pi Zero 2 W and the
    Coral Dev Board alike, so those list no core); an ARM kernel that reports an x86 CPU is an emulator (qemu-user shows
    the host's cpuinfo) and gets the generic profile.
    """
    machine = normalize_arch(arch)
    if machine == "x86_64":
        return "generic-x86_64"
    if machine not in ("aarch64", "armv7l"):
        raise UsageError(f"No shipped target profile for the architecture {arch!r}.",
                         hint="Write one (docs/targets.md) and pass it with --targets-dir DIR.")
    cpu = (cpu_name(cpu_model) or "").lower()
    core = (cpu_name(None, cpu_part) or "").lower()
    board = (model_name or "").strip().lower()
    if _X86_CPU.search(cpu):
        return "generic-aarch64"  # an emulator: the board name, if any, is not this machine's
    matches = board_matches()
    for match in matches:
        if any(re.search(p, board, re.I) or re.search(p, cpu, re.I) for p in match.boards):
            return match.profile
    for match in matches:
        if any(re.search(p, cpu, re.I) or re.search(p, core, re.I) for p in match.cores):
            return match.profile
    return "generic-aarch64"


def match_environment(env: JsonObject) -> str:
    """:func:`match_profile` for a device probe document (``device_probe.probe_environment``)."""
    return match_profile(arch=str(env.get("arch") or ""), cpu_model=env.get("cpu_model"),
                         model_name=env.get("device_model"), cpu_part=env.get("cpu_part"))


@lru_cache(maxsize=1)
def device_probe_module() -> ModuleType:
    """``toolkit/device_side/device_probe.py`` loaded in-process (it is stdlib-only), for ``local``."""
    from toolkit.device_side import PROBE_FILE, source_path

    spec = importlib.util.spec_from_file_location("edgetk_device_probe", source_path(PROBE_FILE))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def probe_local() -> tuple[str, str | None, str | None]:
    """(arch, cpu_model, model_name) of this machine, from the device probe run here."""
    env = device_probe_module().probe_environment()
    return str(env["arch"]), cpu_name(env.get("cpu_model"), env.get("cpu_part")), env.get("device_model")


def host_profile_name() -> str:
    """The shipped profile that matches this machine (``generic-x86_64`` on an x86-64 PC)."""
    return match_environment(device_probe_module().probe_environment())


@dataclass(frozen=True)
class DevicePlatform:
    """What decides which wheels a device can install: the interpreter's arch, glibc and CPython ABI.

    ``arch`` is the interpreter's (a 32-bit Raspberry Pi OS on a 64-bit kernel says ``armv7l`` here although
    ``uname -m`` says aarch64). ``glibc`` is None on a musl or unknown libc.
    """

    arch: str
    python: tuple[int, int]
    glibc: tuple[int, int] | None
    implementation: str = "cp"
    abi: str | None = None

    @property
    def python_version(self) -> str:
        return f"{self.python[0]}.{self.python[1]}"

    @property
    def abi_tag(self) -> str:
        return self.abi or f"cp{self.python[0]}{self.python[1]}"

    @property
    def key(self) -> str:
        """A file name for this platform: ``linux_aarch64-glibc2.36-cp311``."""
        libc = f"glibc{self.glibc[0]}.{self.glibc[1]}" if self.glibc else "nolibc"
        return f"linux_{self.arch}-{libc}-{self.abi_tag}"

    def describe(self) -> str:
        libc = f"glibc {self.glibc[0]}.{self.glibc[1]}" if self.glibc else "no glibc"
        return f"linux {self.arch}, {libc}, CPython {self.python_version} ({self.abi_tag})"

    def platform_tags(self) -> list[str]:
        """Every manylinux tag this device accepts, newest first (pip matches each one exactly)."""
        if self.glibc is None or self.glibc[0] != 2:
            return []
        lowest = _MIN_GLIBC.get(self.arch)
        if lowest is None:
            return []  # armv6l and friends: no manylinux wheels exist
        tags = []
        for minor in range(self.glibc[1], lowest - 1, -1):
            tags.append(f"manylinux_2_{minor}_{self.arch}")
            alias = _LEGACY_ALIASES.get(minor)
            if alias and (minor == 17 or self.arch in ("x86_64", "i686")):
                tags.append(f"{alias}_{self.arch}")
        return tags

    @classmethod
    def from_probe(cls, doc: JsonObject) -> DevicePlatform:
        """From the device probe's document: the interpreter's arch (``pointer_bits`` 32 on a 64-bit kernel
        is a 32-bit userland), its Python version, ABI and glibc."""
        arch = normalize_arch(str(doc.get("wheel_arch") or doc.get("arch") or ""))
        if arch == "aarch64" and doc.get("pointer_bits") == 32:
            arch = "armv7l"
        elif arch == "x86" or (arch == "x86_64" and doc.get("pointer_bits") == 32):
            arch = "i686"  # the wheel tags' name for 32-bit x86
        match = re.match(r"^(\d+)\.(\d+)", str(doc.get("python") or ""))
        if not match:
            raise DeviceError(f"Could not tell the device's Python version from {doc.get('python')!r}.")
        glibc = re.search(r"(\d+)\.(\d+)", str(doc.get("glibc") or ""))
        implementation = {"cpython": "cp", "pypy": "pp"}.get(str(doc.get("implementation") or "cpython"), "cp")
        return cls(arch=arch, python=(int(match.group(1)), int(match.group(2))),
                   glibc=(int(glibc.group(1)), int(glibc.group(2))) if glibc else None,
                   implementation=implementation, abi=doc.get("abi") or None)
