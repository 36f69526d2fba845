"""The package stays mypy-clean (the configuration is in pyproject.toml; the on-device runner, which must run on
Python 3.6, is checked for syntax by vermin in tests/runner instead)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_mypy_is_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:]
