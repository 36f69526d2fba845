"""The native ``.pte`` runner (``toolkit/device_side/pte_runner.cpp``) built for a device and put beside its
ExecuTorch runtime libraries (``edgetk devices setup --runtime executorch``).

ExecuTorch promises no compatibility between versions, so the runner is compiled against the headers and shared
libraries of the exact ``executorch`` release the device runs (the exporter's: the bundle records it), taken from
that release's wheel for the device's arch (``pip download --no-deps``; the libraries need only libc and
libstdc++, only the Python binding needs torch). Where it is built, in order:

1. on this machine, with ``g++`` when the device's arch is this machine's, or the distribution's cross compiler
   (``aarch64-linux-gnu-g++``, Debian/Ubuntu package ``g++-aarch64-linux-gnu``) for an aarch64 device. The binary
   is cached by (arch, executorch version, runner source hash) under ``$XDG_CACHE_HOME/edgetk/pte-runner/`` and
   the wheels under ``$XDG_CACHE_HOME/edgetk/executorch/``, so a second device of the same kind costs a copy;
2. else on the device with its own compiler (``g++``, ``c++`` or ``clang++``), against the wheel setup installed
   there;
3. else :class:`~toolkit.errors.CompilerMissing` naming both ways to get one.

The command line is written once (:func:`compile_argv`) with placeholders, for both places.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolkit.device_side import PTE_RUNNER_SOURCE, source_path
from toolkit.errors import CompilerMissing, DeviceError, UsageError

BINARY = "edgetk-pte-runner"  # the name the device's runner looks for in executorch's lib/ (edgetk_runner.py)
# Linked with --no-as-needed: XNNPACK and the kernels register themselves from static constructors, which the
# linker drops otherwise ("Backend XnnpackBackend is not registered").
LIBRARIES = ("executorch_backend_xnnpack", "executorch_kernels_optimized", "executorch_kernels_quantized",
             "executorch_etdump", "executorch_threadpool", "executorch")
CROSS_COMPILERS = {"aarch64": ("aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu")}  # arch -> (command, package)
WHEEL_PLATFORMS = {"x86_64": "manylinux_2_28_x86_64", "aarch64": "manylinux_2_28_aarch64"}
Log = Callable[[str], None]


def source_hash() -> str:
    """The runner source's sha256 (16 hex digits): part of the cache key, so an edited runner is rebuilt."""
    return hashlib.sha256(source_path(PTE_RUNNER_SOURCE).read_bytes()).hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgetk"


def compile_argv(version: str) -> list[str]:
    """The compiler's argv with ``{compiler}``, ``{source}``, ``{include}`` (the wheel's include/), ``{lib}``
    (its lib/) and ``{out}`` to fill in. ``-rpath $ORIGIN``: the binary lives in that lib/ folder."""
    return ["{compiler}", "-std=c++17", "-O2", "-DC10_USING_CUSTOM_GENERATED_MACROS",
            f'-DEDGETK_EXECUTORCH_VERSION="{version}"', "-I{include}",
            "-I{include}/executorch/runtime/core/portable_type/c10", "{source}", "-o", "{out}", "-L{lib}",
            "-Wl,--no-as-needed", *(f"-l{name}" for name in LIBRARIES), "-Wl,--as-needed", "-Wl,-rpath,$ORIGIN"]


def exporter_version() -> str | None:
    """The executorch release on this machine (the one that exports .pte artifacts), None without one."""
    from importlib import metadata

    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError:
        return None


def _installed_tree() -> Path | None:
    """This Python's executorch package folder when it holds the runtime's include/ and lib/ (found unimported)."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "lib" / "libexecutorch.so").is_file() and (Path(folder) / "include").is_dir():
            return Path(folder)
    return None


def host_compiler(arch: str) -> str | None:
    """This machine's compiler for ``arch``: g++ for its own arch, the cross compiler for aarch64; None if absent."""
    if arch == platform.machine():
        return shutil.which("g++") or shutil.which("c++")
    cross = CROSS_COMPILERS.get(arch)
    return shutil.which(cross[0]) if cross else None


@dataclass(frozen=True)
class RunnerBuild:
    """A runner binary on this machine for (arch, executorch version, source hash); ``cached``: built earlier."""

    path: Path
    arch: str
    version: str
    source_hash: str
    compiler: str
    cached: bool


def _runtime_tree(arch: str, version: str, root: Path, log: Log | None) -> Path:
    """The ``executorch`` folder (include/ and lib/) of that release's wheel for ``arch``, downloaded and unpacked
    once into the cache."""
    tree = root / "executorch" / f"{version}-{arch}"
    if (tree / "executorch" / "lib" / "libexecutorch.so").is_file():
        return tree / "executorch"
    here = _installed_tree()
    if here is not None and arch == platform.machine() and exporter_version() == version:
        return here  # this machine's own executorch: the same release's wheel for this arch
    wheels = root / "executorch" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"executorch-{version}-*{arch}.whl"))
    if not found:
        if arch not in WHEEL_PLATFORMS:
            raise UsageError(f"ExecuTorch publishes no {arch} wheel, so no native .pte runner can be built "
                                    "for this device.", hint="Run .tflite or .onnx artifacts there instead.")
        if log:
            log(f"downloading the executorch {version} wheel for {arch}")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", f"executorch=={version}", "--no-deps", "--only-binary=:all:",
             "--platform", WHEEL_PLATFORMS[arch], "--python-version", "3.11", "--implementation", "cp",
             "--abi", "cp311", "-d", str(wheels), "--disable-pip-version-check", "-q"],
            capture_output=True, text=True, check=False, timeout=900)
        found = sorted(wheels.glob(f"executorch-{version}-*{arch}.whl"))
        if proc.returncode or not found:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise DeviceError(f"Could not download the executorch {version} wheel for {arch} ({tail}).",
                              hint="Check this machine's access to the package index (the native .pte runner is "
                              "built against that release's libraries).")
    partial = tree.with_name(tree.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(found[-1]) as wheel:
        for name in wheel.namelist():
            if name.startswith(("executorch/lib/", "executorch/include/")):
                wheel.extract(name, partial)
    shutil.rmtree(tree, ignore_errors=True)
    os.replace(partial, tree)
    return tree / "executorch"


def build_on_host(arch: str, version: str, *, root: Path | None = None, log: Log | None = None) -> RunnerBuild | None:
    """The runner for ``arch`` against executorch ``version``, built here (or taken from the cache); None when this
    machine has no compiler for ``arch``."""
    root = root or cache_root()
    digest = source_hash()
    binary = root / "pte-runner" / f"{arch}-executorch{version}-{digest}" / BINARY
    compiler = host_compiler(arch)
    if binary.is_file():
        return RunnerBuild(binary, arch, version, digest, compiler or "cached", cached=True)
    if compiler is None:
        return None
    tree = _runtime_tree(arch, version, root, log)
    if log:
        log(f"building the native .pte runner for {arch} (executorch {version}) with {Path(compiler).name}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    fill = {"compiler": compiler, "source": str(source_path(PTE_RUNNER_SOURCE)), "include": str(tree / "include"),
            "lib": str(tree / "lib"), "out": str(binary) + ".partial"}
    proc = subprocess.run([part.format(**fill) for part in compile_argv(version)], capture_output=True, text=True,
                          check=False, timeout=900)
    if proc.returncode:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])[-1200:]
        raise DeviceError(f"Building the native .pte runner for {arch} failed:\n{tail}",
                          hint=f"Check {Path(compiler).name} (it must take -std=c++17) and the executorch "
                          f"{version} wheel in {tree.parent}.")
    os.replace(str(binary) + ".partial", binary)
    return RunnerBuild(binary, arch, version, digest, compiler, cached=False)


def no_compiler_error(device: str, arch: str) -> CompilerMissing:
    """Neither this machine nor the device can build the runner: say which compiler to install where."""
    cross = CROSS_COMPILERS.get(arch)
    here = (f"`sudo apt-get install {cross[1]}` on this machine (Debian/Ubuntu)" if cross and arch != platform.machine()
            else "g++ on this machine" if arch == platform.machine() else None)
    ways = " or ".join(w for w in (here, "g++ on the device (`sudo apt-get install g++`)") if w)
    return CompilerMissing(
        f"{device}: no C++ compiler can build the native .pte runner for {arch}: this machine has none for "
        f"{arch} and the device has none either.",
        hint=f"Install {ways}, then run setup again. Without the runner the device's .pte artifacts need "
        "ExecuTorch's Python binding and torch.")
