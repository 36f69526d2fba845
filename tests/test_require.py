"""EDGETK_REQUIRE turns the skip of a test that needs a required kind of environment into a failure, and only
that: other skips, and skips of kinds not required, stay skips. Run in a child pytest on a small test file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

INNER = '''
import pytest

@pytest.fixture
def _ssh_farm():
    pytest.skip("no root here")

@pytest.fixture
def uses_farm(_ssh_farm):
    return _ssh_farm

@pytest.mark.arm
def test_marked_arm():
    pytest.skip("no qemu here")

def test_fixture_chain_to_ssh(uses_farm):
    pass

def test_plain_skip():
    pytest.skip("nothing to do with the environment")

@pytest.mark.ssh
def test_runs():
    assert True
'''


def _run(tmp_path: Path, require: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    ssh: x\n    arm: x\n    netns: x\n")
    env = {k: v for k, v in os.environ.items() if k != "EDGETK_REQUIRE"}
    env["PYTHONPATH"] = str(REPO)
    if require is not None:
        env["EDGETK_REQUIRE"] = require
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.fixtures.require", "-p", "no:cacheprovider",
                           "-rA", "-q", str(tmp_path / "test_inner.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_without_require_skips_are_skips(tmp_path: Path) -> None:
    result = _run(tmp_path, None)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 3 skipped" in result.stdout, result.stdout


def test_required_kinds_fail_when_skipped(tmp_path: Path) -> None:
    result = _run(tmp_path, "ssh,arm")
    assert result.returncode == 1, result.stdout
    # a skip in the test is a failure, one in a fixture's setup an error: either fails the run
    assert "FAILED test_inner.py::test_marked_arm" in result.stdout
    assert "ERROR test_inner.py::test_fixture_chain_to_ssh" in result.stdout  # found through the fixture chain
    assert "needs arm and was skipped (Skipped: no qemu here)" in result.stdout
    assert "needs ssh and was skipped (Skipped: no root here)" in result.stdout
    assert "PASSED test_inner.py::test_runs" in result.stdout
    assert "SKIPPED" in result.stdout and "nothing to do with the environment" in result.stdout


def test_only_the_named_kinds(tmp_path: Path) -> None:
    result = _run(tmp_path, "netns")
    assert result.returncode == 0 and "1 passed, 3 skipped" in result.stdout, result.stdout


def test_a_typo_is_an_error_not_a_silent_pass(tmp_path: Path) -> None:
    result = _run(tmp_path, "ssh,qemu")
    assert result.returncode == 4, result.stdout + result.stderr  # pytest's usage-error exit
    assert "EDGETK_REQUIRE: unknown kind" in result.stdout + result.stderr
