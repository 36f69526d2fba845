"""One device probe and one arch table (toolkit/model/platform.py): the runner and the helper ship with the probe's
own block inlined (written once, in device_probe.py; shared.py's blocks alike), and deploy, setup and profile
matching name an arch alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit import device_side
from toolkit.model.platform import DevicePlatform, accepted_arches, match_environment, normalize_arch, probe_local


@pytest.mark.parametrize("name", device_side.ASSEMBLED)
def test_the_shipped_runner_and_helper_carry_each_block_written_once(name: str) -> None:
    """The probe (device_probe.py), the runtime table and the file hash (shared.py) are written once: the
    hand-written file (the runner's: with its blocks, src/runner/) holds a marker line, the shipped one the block
    exactly as its own file holds it."""
    source = "".join(path.read_text() for path in (device_side.SRC_DIR / name, *device_side.source_blocks(name)))
    shipped = device_side.source_path(name)
    for block in device_side.ASSEMBLED[name]:
        assert f"# --- begin {block}" not in source and source.count(device_side.mark(block)) == 1  # no copy
        text = device_side.block_text(block)
        assert shipped.read_text().count(text) == 1 and text.count("\n") > 2
    assert not [block for block in device_side.BLOCKS if device_side.mark(block) in shipped.read_text()]
    assert shipped.stat().st_mode & 0o777 == 0o644
    assert device_side.source_path(name) == shipped  # assembled once: the same text is the same file


def test_probe_runs_on_python_3_6() -> None:
    vermin = Path(sys.executable).parent / "vermin"
    result = subprocess.run([str(vermin), "--target=3.6-", "--no-tips", "--violations",
                             str(device_side.source_path(device_side.PROBE_FILE))], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_probe_standalone_and_in_process_agree() -> None:
    """setup runs the file with `python -c`; `local` loads it: same machine, same facts."""
    source = device_side.source_path(device_side.PROBE_FILE).read_text()
    doc = json.loads(subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                                    check=True).stdout)
    arch, _, board = probe_local()
    assert doc["arch"] == arch and doc["device_model"] == board
    assert doc["numpy"] is True and doc["pointer_bits"] in (32, 64)
    assert DevicePlatform.from_probe(doc).python == sys.version_info[:2]


@pytest.mark.parametrize(("spelling", "canonical"), [
    ("armv8l", "armv7l"), ("armhf", "armv7l"), ("ARM64", "aarch64"), ("amd64", "x86_64"), ("riscv64", "riscv64"),
])
def test_one_arch_table(spelling: str, canonical: str) -> None:
    """armv8l is a 32-bit ARM userland: deploy (accepted arches), setup (wheel platform) and profile matching
    all call it armv7l (they used to disagree)."""
    assert normalize_arch(spelling) == canonical
    assert spelling.lower() in accepted_arches(canonical)
    if canonical in ("armv7l", "aarch64", "x86_64"):
        assert DevicePlatform.from_probe({"arch": spelling, "python": "3.11.2", "glibc": "2.36"}).arch == canonical


def test_profile_from_a_probe_document() -> None:
    pi4_64 = {"arch": "aarch64", "cpu_model": None, "cpu_part": "0xd08", "device_model": None}
    assert match_environment(pi4_64) == "raspberry-pi-4"
    pi4_32 = {"arch": "armv7l", "cpu_model": "ARMv7 Processor rev 3 (v7l)", "cpu_part": "0xd08",
              "device_model": "Raspberry Pi 4 Model B Rev 1.1"}
    assert match_environment(pi4_32) == "raspberry-pi-4"
    qemu = {"arch": "aarch64", "cpu_model": "AMD EPYC 7763", "cpu_part": "0xd08", "device_model": None}
    assert match_environment(qemu) == "generic-aarch64"
