"""No dead code in toolkit/: vulture (pinned in the [test] extra, configured in pyproject.toml's [tool.vulture])
finds no unused function, class, variable, attribute or import. What is used where vulture cannot see it is in
tests/dead_code_whitelist.py with who uses it; code that only its own tests reach is removed (the few helpers
kept for the tests are listed there as such)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _vulture(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vulture", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.fast
def test_no_dead_code_in_toolkit():
    run = _vulture()  # paths, exclusions and confidence from [tool.vulture]
    assert run.returncode == 0 and not run.stdout.strip(), (
        "unused code (remove it; if something uses it where vulture cannot see, list it in "
        f"tests/dead_code_whitelist.py with who uses it):\n{run.stdout}{run.stderr}")


@pytest.mark.fast
def test_the_check_finds_a_planted_unused_function(tmp_path):
    """The check itself, with the project's own settings: an unused function next to the code is reported."""
    planted = tmp_path / "planted.py"
    planted.write_text("def never_called() -> int:\n    return 1\n")
    run = _vulture("toolkit", "tests/dead_code_whitelist.py", str(planted))
    assert run.returncode == 3 and "never_called" in run.stdout, run.stdout + run.stderr
