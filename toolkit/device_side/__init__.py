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
- ``mender_module.py``: the Mender Update Module written next to every Mender artifact;
- ``pte_runner.cpp``: the native ``.pte`` runner (C++ against ExecuTorch's runtime libraries, no torch), built for
  the device's arch by ``toolkit.delivery.pte_runner`` and driven by the runner through a framed pipe;
- ``shared.py``: never shipped alone: the runtime table and a file's sha256, inlined into the runner and the helper
  and imported by the host (it is stdlib-only).

The runner and the helper are written by hand in ``src/`` as blocks of one job each, with one marker line where
each shared block goes: the shipped single file is assembled from them (the shared blocks inlined there: the probe
from ``device_probe.py``, the runtime table and the file hash from ``shared.py``, which the host imports too), so
each is written once. ``src/edgetk_runner.py`` and ``src/device_helper.py`` are heads (docstring, imports, the
``__main__`` line) with one block line per ``src/runner/*.py`` or ``src/helper/*.py`` file, in the order they are
inlined (each block's lines from its SHIPPED line on; the lines above it import names of the blocks inlined before
it, never after, for the host's type checker, ``src/mypy.ini``, and are not shipped). tests/runner/test_blocks.py
holds both to the rules: each block named once and at most 600 lines, imports one way, mypy-clean.

A new helper verb is a ``cmd_<verb>`` function in the block of its job (its argv words are its parameters, its
answer goes out through ``emit`` and a refusal through ``fail`` with a HelperRefusal word) and its row in
``COMMANDS`` (``src/helper/cli.py``), plus the host's call (``toolkit.delivery.deployment``) and its typed answer
(``toolkit.model.answers``); a new block adds its block line in ``src/device_helper.py``, after the blocks it
imports from (docs/design.md counts the files).

The host reads every file through :func:`source_path`, which assembles on first use into a temporary folder of the
process (keyed by the assembled text's hash, so a changed source is a new file; nothing is left in the user's
cache).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

DEVICE_SIDE_DIR = Path(__file__).resolve().parent
SRC_DIR = DEVICE_SIDE_DIR / "src"
RUNNER_FILE = "edgetk_runner.py"
HELPER_FILE = "device_helper.py"
PROBE_FILE = "device_probe.py"
SETUP_FILE = "device_setup.py"
PTE_RUNNER_SOURCE = "pte_runner.cpp"  # the native .pte runner's C++ source (built by toolkit.delivery.pte_runner)
SHARED_FILE = "shared.py"
BLOCKS = {"device probe": PROBE_FILE, "runtime table": SHARED_FILE, "file hash": SHARED_FILE}  # block -> its file
ASSEMBLED = {  # written in src/ with a marker line (mark(block)) where each of these blocks goes
    RUNNER_FILE: ("device probe", "runtime table", "file hash"),
    HELPER_FILE: ("device probe", "file hash"),
}


def mark(block: str) -> str:
    """The line that stands in a ``src/`` file where ``block`` is inlined."""
    return f"# --- {block}: {BLOCKS[block]}'s block, inlined here when assembled (toolkit.device_side) ---\n"


def block_text(block: str) -> str:
    """``block`` as its file holds it: from its ``# --- begin BLOCK`` line to its ``# --- end BLOCK ---`` line."""
    text = (DEVICE_SIDE_DIR / BLOCKS[block]).read_text()
    end = f"# --- end {block} ---\n"
    return text[text.index(f"# --- begin {block}"):text.index(end) + len(end)]


SHIPPED = "# --- shipped from here (the lines above are for the host's type checker) ---\n"  # in each block
# in an assembled src/ file, one per block: the block's path under src/ (src/runner/ for the runner's, src/helper/ for
# the helper's)
BLOCK_LINE = re.compile(r"^# --- block: (\w+/\w+\.py) ---\n", re.M)


def source_blocks(name: str) -> tuple[Path, ...]:
    """The block files the ``src/`` file ``name`` names by its block lines, in the order they are inlined."""
    return tuple(SRC_DIR / match.group(1) for match in BLOCK_LINE.finditer((SRC_DIR / name).read_text()))


def shipped_text(block: Path) -> str:
    """What one block puts in the shipped file: its lines from its SHIPPED line on (that line left out)."""
    text = block.read_text()
    if text.count(SHIPPED) != 1:
        raise RuntimeError(f"{block.relative_to(SRC_DIR)} must hold the line {SHIPPED.strip()!r} exactly once")
    return text.split(SHIPPED, 1)[1]


def assemble(name: str) -> str:
    """The text of the shipped ``name``: its ``src/`` file with each block after its block line, then each shared
    block's text in place of its marker line (a block may hold one)."""
    text = BLOCK_LINE.sub(lambda match: match.group(0) + shipped_text(SRC_DIR / match.group(1)),
                          (SRC_DIR / name).read_text())
    for block in ASSEMBLED[name]:
        if text.count(mark(block)) != 1:
            raise RuntimeError(f"src/{name} and its blocks must hold the marker line of the {block} exactly once")
        text = text.replace(mark(block), block_text(block))
    return text


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
