"""Everything that runs ON the device, in one place.

Each shipped file is a standalone script (Python >= 3.6, stdlib + numpy + one runtime at most, vermin-checked) that
the host copies to the device and runs with the device's own Python; nothing in the toolkit imports them:

- ``edgetk_runner.py``: the on-device runner, copied into every bundle (probe, check, run-one);
- ``device_helper.py``: the deploy helper (install, verify, switch, rollback, status), installed once per
  device under ``~/.edgetk/helper/`` keyed by its hash;
- ``device_probe.py``: the one device probe (arch, CPU, board, Python, glibc, memory, clocks). Setup runs it as
  it is, and ``toolkit.model.platform.probe_local`` loads it in-process for this machine (it is stdlib-only);
- ``device_setup.py``: the device's steps of ``edgetk devices setup`` (the venv, the pushed wheels, the import
  check, the recorded python), run as ``python -c`` before anything is installed there;
- ``mender_module.py``: the Mender Update Module written next to every Mender artifact.

The runner and the helper are written by hand in ``src/`` with one marker line where the probe goes: the shipped
single file is assembled from them (the probe's block inlined there), so the probe is written once. The host
reads every file through :func:`source_path`, which assembles on first use into a temporary folder of the process
(keyed by the assembled text's hash, so a changed source is a new file; nothing is left in the user's cache).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

DEVICE_SIDE_DIR = Path(__file__).resolve().parent
SRC_DIR = DEVICE_SIDE_DIR / "src"
RUNNER_FILE = "edgetk_runner.py"
HELPER_FILE = "device_helper.py"
PROBE_FILE = "device_probe.py"
SETUP_FILE = "device_setup.py"
ASSEMBLED = (RUNNER_FILE, HELPER_FILE)  # written in src/ with PROBE_MARK where device_probe.py's block goes
PROBE_BEGIN = "# --- begin device probe"
PROBE_END = "# --- end device probe ---\n"
PROBE_MARK = "# --- device probe: device_probe.py's block, inlined here when assembled (toolkit.device_side) ---\n"


def assemble(name: str) -> str:
    """The text of the shipped ``name``: its ``src/`` file with the probe's block in place of the marker line."""
    text = (SRC_DIR / name).read_text()
    probe = (DEVICE_SIDE_DIR / PROBE_FILE).read_text()
    block = probe[probe.index(PROBE_BEGIN):probe.index(PROBE_END) + len(PROBE_END)]
    if text.count(PROBE_MARK) != 1:
        raise RuntimeError(f"src/{name} must hold the device probe's marker line exactly once")
    return text.replace(PROBE_MARK, block)


def source_path(name: str) -> Path:
    """The path of one shipped device-side file (an assembled one is written on first use to this process's
    temporary folder, removed when the process ends)."""
    if name not in ASSEMBLED:
        return DEVICE_SIDE_DIR / name
    text = assemble(name)
    path = _assembly_dir() / hashlib.sha256(text.encode()).hexdigest()[:16] / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.")
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temp, 0o644)  # readable like the package's own files (mkstemp makes 0600)
        os.replace(temp, path)
    return path


_ASSEMBLY: list[Path] = []  # this process's folder, made on first use


def _assembly_dir() -> Path:
    if not _ASSEMBLY:
        folder = Path(tempfile.mkdtemp(prefix="edgetk-device-side-"))
        owner = os.getpid()

        def remove() -> None:
            if os.getpid() == owner:  # not from a forked child
                shutil.rmtree(folder, ignore_errors=True)

        atexit.register(remove)
        _ASSEMBLY.append(folder)
    return _ASSEMBLY[0]
