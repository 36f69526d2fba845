"""Bundle files that ``deploy`` leaves out and a check pushes only when it needs them: the eval set (``eval/``,
:mod:`toolkit.checks.device_eval`) and the layer probes (``layers/``, :mod:`toolkit.checks.divergence`).

Like every artifact they are verified by sha256 where they are read. ``manifest.json`` (schema 3) lists each
one under ``on_demand`` with its sha256 and size. The host checks the bundle's copies before it uses or pushes
them; the device's runner checks the files it reads (the eval inputs, the probe's tensor list, the ONNX copy
with the tensors exposed) against its own installed ``manifest.json`` before use, and refuses a mismatch (an
``integrity`` error, as for an artifact). A pushed file lands under a temporary name and is renamed, so an
interrupted push leaves no short file behind; one already on the device is not pushed again (the version
folder is named by the manifest's hash, which holds the file's). A bundle written before schema 3 has no
record: its eval set and probes are not used, and the message says to convert again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.delivery.bundle import EVAL_DIR, LAYERS_DIR, safe_relative, sha256_file
from toolkit.errors import DeviceError, UsageError
from toolkit.model.manifest import FileRef

if TYPE_CHECKING:
    from toolkit.delivery.bundle import Bundle
    from toolkit.delivery.deployment import Device

FOLDERS = (EVAL_DIR, LAYERS_DIR)
UNRECORDED = "was written by an older edgetk, which did not record it in manifest.json"
CONVERT_AGAIN = "Convert the bundle again with this edgetk (its manifest then records the file's sha256)."


def record(staging: Path) -> tuple[FileRef, ...]:
    """Every file under ``eval/`` and ``layers/`` of a bundle being written, hashed (for the manifest)."""
    found = sorted(p for folder in FOLDERS for p in (staging / folder).rglob("*") if p.is_file())
    return tuple(FileRef(p.relative_to(staging).as_posix(), sha256_file(p), p.stat().st_size) for p in found)


def recorded(bundle: Bundle, name: str) -> FileRef | None:
    """The manifest's record of ``name`` (bundle-relative), None when it has none."""
    return next((f for f in bundle.manifest.on_demand if f.file == name), None)


def verified(bundle: Bundle, name: str) -> Path:
    """The bundle's copy of ``name`` after checking it against the manifest's sha256 (UsageError otherwise)."""
    ref = recorded(bundle, name)
    if ref is None:
        raise UsageError(f"{name} in the bundle {bundle.path} {UNRECORDED}.", hint=CONVERT_AGAIN)
    path = bundle.path / safe_relative(name)
    if path.is_symlink() or not path.is_file():
        raise UsageError(f"The bundle {bundle.path} lists {name} in manifest.json, but the file is missing.",
                         hint="Rebuild the bundle with `edgetk convert`.")
    if sha256_file(path) != ref.sha256:
        raise UsageError(f"{name} in the bundle {bundle.path} does not match its sha256 in manifest.json.",
                         hint="The file was changed after conversion: rebuild the bundle with `edgetk convert`.")
    return path


def push(device: Device, bundle: Bundle, vdir: str, names: Sequence[str]) -> None:
    """Put ``names`` (verified here first) into the installed version's folder, those not there yet."""
    paths = {name: verified(bundle, name) for name in names}
    missing = [n for n in names if not device.conn.exists(f"{vdir}/{n}")]
    for folder in dict.fromkeys(str(Path(n).parent) for n in missing):
        made = device.conn.run(["mkdir", "-p", f"{vdir}/{folder}"], timeout=60)
        if not made.ok:
            raise DeviceError(f"{device.spec.name}: cannot create {vdir}/{folder} ({made.stderr.strip()[-200:]}).")
    for name in missing:
        device.conn.put(paths[name], f"{vdir}/{name}.part")
        moved = device.conn.run(["mv", "-f", f"{vdir}/{name}.part", f"{vdir}/{name}"], timeout=60)
        if not moved.ok:
            raise DeviceError(f"{device.spec.name}: cannot write {vdir}/{name} ({moved.stderr.strip()[-200:]}).")
