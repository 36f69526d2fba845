"""``edgetk export BUNDLE --mender --device-type T -o bundle.mender``: a Mender module-image artifact.

Built by Debian's ``mender-artifact`` (``write module-image -T edgetk``), so the format is Mender's own and
``mender-artifact read/validate`` accept it. The payload is ``bundle.tar`` (every file ``deploy`` would push),
``device_helper.py`` (the helper ``deploy`` runs: the same lock, sha256 checks and atomic ``current`` switch)
and ``edgetk-meta.json`` (name, version, files and sha256, check runs and the latency budget). The
``edgetk`` Update Module (``toolkit/device_side/mender_module.py``) must be on the device; it is written next
to the artifact as ``<output>.edgetk-module`` to install once as ``/usr/share/mender/modules/v3/edgetk``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UsageError
from toolkit.model.policy import GateOptions, budget_for

MODULE_TYPE = "edgetk"
MODULE_FILE = "mender_module.py"
_DEVICE_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class MenderExport:
    """What ``export --mender`` wrote."""

    artifact: Path
    module: Path
    artifact_name: str
    device_types: tuple[str, ...]
    bytes: int
    bundle: str
    version: str

    def to_dict(self) -> dict[str, object]:
        return {"artifact": str(self.artifact), "module": str(self.module), "artifact_name": self.artifact_name,
                "device_types": list(self.device_types), "bytes": self.bytes, "bundle": self.bundle,
                "version": self.version, "type": MODULE_TYPE}


def _tool() -> str:
    found = shutil.which("mender-artifact")
    if found is None:
        raise UsageError("Building a Mender artifact needs the `mender-artifact` tool, which is not installed.",
                         hint="Install it: apt-get install mender-artifact (Debian/Ubuntu), or from Mender's releases.")
    return found


def export_mender(
    bundle_path: str | Path,
    *,
    device_types: tuple[str, ...],
    output: str | Path,
    artifact_name: str | None = None,
    runs: int = 20,
    warmup: int = 3,
    budget_ms: float | None = None,
    force: bool = False,
) -> MenderExport:
    """Write the artifact (and the Update Module beside it); the bundle is verified first."""
    from toolkit import device_side
    from toolkit.delivery.bundle import read_bundle
    from toolkit.delivery.deployment import KEEP_VERSIONS, validate_name

    if not device_types:
        raise UsageError("--mender needs --device-type (e.g. raspberrypi4), as Mender devices report it.")
    for dt in device_types:
        if not _DEVICE_TYPE.match(dt):
            raise UsageError(f"--device-type {dt!r} is not a Mender device type (letters, digits, . _ + -).")
    bundle = read_bundle(Path(bundle_path))
    bundle.verify()
    validate_name(bundle.name)
    out = Path(output)
    if out.exists() and not force:
        raise UsageError(f"{out} exists.", hint="Pass --force to replace it, or another -o path.")
    if not out.parent.is_dir():
        raise UsageError(f"The folder of {out} does not exist.", hint="Create it or pick another -o path.")
    name = artifact_name or f"{bundle.name}-{bundle.version[:12]}"
    files = bundle.files()
    meta = {
        "schema": "edgetk-mender/1", "name": bundle.name, "version": bundle.version,
        "files": [[f.path, f.sha256, f.bytes] for f in files], "keep": KEEP_VERSIONS,
        "runner": bundle.manifest.runner.file if bundle.manifest.runner else None, "runs": runs, "warmup": warmup,
        # --budget-ms, else the bundle's check policy budget (what `edgetk check` gates on), else None
        "budget_ms": budget_for(bundle.manifest.check_policy, GateOptions(budget_ms=budget_ms)).ms,
        "target": bundle.manifest.target.name,
    }
    tool = _tool()
    with tempfile.TemporaryDirectory(prefix="edgetk-mender-") as tmp:
        work = Path(tmp)
        with tarfile.open(work / "bundle.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            for f in files:
                tar.add(bundle.path / f.path, arcname=f.path, recursive=False)
        shutil.copyfile(device_side.source_path(device_side.HELPER_FILE), work / "device_helper.py")
        (work / "edgetk-meta.json").write_text(json.dumps(meta, indent=1))
        partial = out.with_name(out.name + ".part")
        argv = [tool, "write", "module-image", "-T", MODULE_TYPE, "-n", name, "-o", str(partial),
                "--software-name", bundle.name, "--software-version", bundle.version[:12]]
        for dt in device_types:
            argv += ["-t", dt]
        for payload in ("bundle.tar", "device_helper.py", "edgetk-meta.json"):
            argv += ["-f", str(work / payload)]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            partial.unlink(missing_ok=True)
            reason = " ".join(proc.stderr.split())[-400:] or f"exit code {proc.returncode}"
            raise UsageError(f"mender-artifact could not write {out}: {reason}")
        partial.replace(out)
    module = out.with_name(out.name + ".edgetk-module")
    shutil.copyfile(device_side.source_path(MODULE_FILE), module)
    module.chmod(0o755)
    return MenderExport(out, module, name, tuple(device_types), out.stat().st_size, bundle.name, bundle.version)
