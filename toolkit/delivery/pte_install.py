"""The native ``.pte`` runner onto a device (``edgetk devices setup --runtime executorch``): built on this
machine (:mod:`toolkit.delivery.pte_runner`) and pushed, else built on the device with its own compiler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.delivery.pte_runner import build_on_host, compile_argv, no_compiler_error
from toolkit.delivery.setup_steps import run_json, setup_step
from toolkit.delivery.wheels import Log
from toolkit.errors import DeviceError

if TYPE_CHECKING:
    from toolkit.delivery.deployment import Device


def install_pte_runner(device: Device, venv_python: str, arch: str, version: str, log: Log | None) -> str:
    """The native .pte runner into the venv's executorch lib/ folder: built (or cached) on this machine and pushed,
    else built on the device with its compiler; started once there either way. Returns the note saying which."""
    from toolkit.device_side import PTE_RUNNER_SOURCE, source_path

    folder = f"{device.base}/pte-runner"  # in the toolkit's home on the device, wherever that is
    build = build_on_host(arch, version, log=log)
    run_json(device, setup_step(venv_python, "list", folder), "making the .pte runner's folder")
    if build is not None:
        remote = f"{folder}/{build.path.parent.name}"
        device.conn.put(build.path, remote)
        done = run_json(device, setup_step(venv_python, "pte-runner-install", remote), "installing the .pte runner")
        how = (f"the native .pte runner (executorch {version}, {arch}) "
               f"{'from the cache' if build.cached else 'built with ' + Path(build.compiler).name} on this machine")
    else:
        remote = f"{folder}/{PTE_RUNNER_SOURCE}"
        device.conn.put(source_path(PTE_RUNNER_SOURCE), remote)
        if log:
            log(f"building the native .pte runner on {device.spec.name} (no {arch} compiler here)")
        done = run_json(device, setup_step(venv_python, "pte-runner-build", remote, json.dumps(compile_argv(version))),
                         "building the .pte runner on the device", timeout=1800)
        if done.get("compiler") is None:
            raise no_compiler_error(device.spec.name, arch)
        how = f"the native .pte runner (executorch {version}) built on the device with {done['compiler']}"
    if not done.get("ok"):
        raise DeviceError(f"{device.spec.name}: the native .pte runner does not start there: "
                          f"{str(done.get('output'))[-400:]}",
                          hint="Check that executorch's libraries in the venv match the device's arch and glibc.")
    return f"{how}: {done['binary']}"
