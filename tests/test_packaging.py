"""The wheel: built from this checkout, installed into a fresh virtual environment, used from outside the
checkout. Proves that targets/ and calibration/ ship as package data and that the entry point works.

The fresh environment takes the wheel itself with --no-deps; its third-party dependencies are made visible
through a .pth line pointing at the test environment's site-packages (downloading 3 GB again would prove
nothing about our packaging).
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        check=True, capture_output=True, text=True,
    )
    (path,) = out.glob("edge_toolkit-*.whl")
    return path


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    python = root / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, text=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return root


def test_wheel_carries_targets_and_calibration(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "toolkit/_data/targets/raspberry-pi-4.toml" in names
    assert "toolkit/_data/calibration/digits/calibration.npz" in names
    assert "toolkit/device_side/src/edgetk_runner.py" in names  # assembled with device_probe.py at first use
    assert "toolkit/device_side/src/runner/loaders.py" in names  # and with the runner's blocks
    assert "toolkit/device_side/device_probe.py" in names
    assert "toolkit/device_side/mender_module.py" in names  # written next to every Mender artifact
    assert "toolkit/store/migrations/env.py" in names  # the history's Alembic migrations run from the wheel
    assert "toolkit/store/migrations/versions/0002_shared_history.py" in names
    assert "toolkit/store/migrations/versions/0003_selections.py" in names
    assert not any(name.startswith("tests/") for name in names)


def test_installed_cli_runs_outside_the_checkout(fresh_env: Path, digits_keras, tmp_path: Path) -> None:
    edgetk = fresh_env / "bin" / "edgetk"
    where = subprocess.run([str(fresh_env / "bin" / "python"), "-c", "import toolkit; print(toolkit.__file__)"],
                           cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    assert str(fresh_env) in where  # the wheel's copy, not the checkout
    help_text = subprocess.run([str(edgetk), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert help_text.returncode == 0 and "convert" in help_text.stdout
    listed = subprocess.run([str(edgetk), "targets", "list", "--json"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert listed.returncode == 0, listed.stderr
    assert "raspberry-pi-4" in {t["name"] for t in json.loads(listed.stdout)}

    data = subprocess.run([str(fresh_env / "bin" / "python"), "-c",
                           "from toolkit.resources import calibration_dir; print(calibration_dir())"],
                          cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()
    assert str(fresh_env) in data
    converted = subprocess.run(
        [str(edgetk), "convert", str(digits_keras), "--calibration", f"{data}/digits/calibration.npz",
         "--precision", "int8", "--format", "tflite", "--out", str(tmp_path / "bundle"), "--no-cache", "--json"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert converted.returncode == 0, converted.stderr
    manifest = json.loads(converted.stdout)
    assert manifest["artifacts"][0]["file"] == "model.int8.tflite"
    assert manifest["runner"] is not None and (tmp_path / "bundle" / "edgetk_runner.py").is_file()
