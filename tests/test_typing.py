"""The package stays mypy-clean (the configuration is in pyproject.toml; the on-device runner, which must run on
Python 3.6, is checked for syntax by vermin in tests/runner, and its blocks by mypy with their own configuration in
tests/runner/test_blocks.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_mypy_is_clean() -> None:
    """With the fixture cache set (``./scripts/test``), mypy keeps its incremental cache there: a module whose
    source hash is unchanged since the last run is not checked again (about 70 s of one core otherwise)."""
    cache = os.environ.get("EDGETK_TEST_CACHE")
    args = ["--cache-dir", str(Path(cache) / "mypy")] if cache else []
    result = subprocess.run([sys.executable, "-m", "mypy", *args], cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-5000:]
