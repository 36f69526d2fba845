"""``./scripts/quickstart`` in a fresh ``git clone`` of this repository: the README's set-up command, run as a
new user runs it, must end in a passing verdict and a bundle (how long it took is printed, not asserted: the
subprocess timeout only catches a hang).

The default test points the script at the project's existing environment (``EDGETK_VENV``: the script then
installs nothing and runs the clone's own code with ``python -m toolkit.cli``), with an empty user cache, so
the example model is trained from scratch and the conversion cache is cold: everything but pip is real.
The script's own set-up runs too, in a clone whose ``.venv`` already exists and sees the pinned stack (a ``.pth``
file naming the suite's site-packages): the script takes its install path (``pip install -e '.[all]'``, every
requirement found satisfied, the clone itself installed editable with its ``edgetk`` command) and gives the
verdict. Installing the stack from nothing is what CI does first, with the README's ``./scripts/test`` and a
``pip check``; repeating those GBs of wheels here proved nothing more and cost four minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, capture_output=True, timeout=120)
    return clone


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGETK_", "XDG_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_DATA_HOME=str(tmp_path / "data"),
               **extra)
    return env


def _check(result: subprocess.CompletedProcess[str], clone: Path, seconds: float) -> dict:  # type: ignore[type-arg]
    assert result.returncode == 0, result.stderr[-4000:]
    doc = json.loads(result.stdout)
    assert doc["passed"] is True and doc["failed_stage"] is None
    bundle = Path(doc["bundle"])
    if not bundle.is_absolute():
        bundle = clone / bundle
    assert (bundle / "manifest.json").is_file() and (bundle / "run.toml").is_file()
    assert bundle.resolve().is_relative_to(clone.resolve())
    # the shipped data came from the clone, i.e. the clone's code ran
    assert doc["config"]["calibration"].startswith(str(clone.resolve()))
    manifest = doc["manifest"]
    assert manifest["target"]["name"] and manifest["labels"] == [str(i) for i in range(10)]
    assert any(a["precision"] == "int8" for a in manifest["artifacts"])
    assert all(a["verification"]["accuracy"] > 0.9 for a in manifest["artifacts"])
    (device,) = doc["devices"]
    assert device["device"] == "local" and device["ok"]
    assert all(r["outputs_match"]["ok"] and r["gates"]["passed"] for r in device["reports"])
    assert "training the example model" in result.stderr
    print(f"scripts/quickstart took {seconds:.1f} s", file=sys.stderr)
    return doc


def test_scripts_quickstart_in_a_fresh_clone(tmp_path):  # type: ignore[no-untyped-def]
    clone = _clone(tmp_path)
    venv = Path(sys.executable).parent.parent
    started = time.perf_counter()
    result = subprocess.run([str(clone / "scripts" / "quickstart"), "--json"], check=False, cwd=clone,
                            env=_env(tmp_path, EDGETK_VENV=str(venv)), capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    _check(result, clone, seconds)
    assert not (clone / ".venv").exists()  # EDGETK_VENV: nothing created, nothing installed

    again = subprocess.run([str(clone / "scripts" / "quickstart")], check=False, cwd=clone,
                           env=_env(tmp_path, EDGETK_VENV=str(venv)), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "using the example model cached" in again.stderr and "reusing the cached conversion" in again.stderr
    assert "PASS" in again.stdout and "edgetk report" in again.stdout


def test_scripts_quickstart_refuses_a_missing_venv(tmp_path):  # type: ignore[no-untyped-def]
    clone = _clone(tmp_path)
    result = subprocess.run([str(clone / "scripts" / "quickstart")], check=False, cwd=clone,
                            env=_env(tmp_path, EDGETK_VENV=str(tmp_path / "nope")), capture_output=True, text=True)
    assert result.returncode == 2 and "has no bin/python" in result.stderr


def _prepared_venv(clone: Path) -> Path:
    """``clone/.venv``, a new venv that also reads the suite's site-packages (a ``.pth`` file): the stack is there."""
    import site
    import sysconfig

    venv = clone / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   timeout=120)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    # addsitedir: the suite's own .pth files apply too; the clone's editable install (a .pth sorted first) wins
    (purelib / "suite-stack.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
    return venv


def test_scripts_quickstart_sets_up_its_venv_and_gives_the_verdict(tmp_path):  # type: ignore[no-untyped-def]
    clone = _clone(tmp_path)
    venv = _prepared_venv(clone)
    assert not (venv / "bin" / "edgetk").exists()
    env = _env(tmp_path)
    env["PIP_CACHE_DIR"] = os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    started = time.perf_counter()
    result = subprocess.run([str(clone / "scripts" / "quickstart"), "--json"], check=False, cwd=clone, env=env,
                            capture_output=True, text=True, timeout=1800)
    _check(result, clone, time.perf_counter() - started)
    assert "installing edge-toolkit[all] into .venv" in result.stderr
    assert (venv / "bin" / "edgetk").is_file()  # the script's pip install put the clone's command in its venv
    shown = subprocess.run([str(venv / "bin" / "python"), "-c", "import toolkit; print(toolkit.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert shown.returncode == 0 and Path(shown.stdout.strip()).resolve().is_relative_to(clone.resolve())
