"""Where the shipped data (target profiles, calibration sets) lives: inside the wheel as package data
(``toolkit/_data/``), or at the top level of a source checkout (``targets/``, ``calibration/``); and where this
user's caches live (``$XDG_CACHE_HOME/edgetk/``, default ``~/.cache/edgetk/``)."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The shipped folder ``name`` (``targets`` or ``calibration``), wheel first, then the checkout."""
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"edge-toolkit's {name}/ folder is missing from this installation")


def targets_dir() -> Path:
    return data_dir("targets")


def calibration_dir() -> Path:
    return data_dir("calibration")


def cache_dir(name: str) -> Path:
    """``$XDG_CACHE_HOME/edgetk/<name>`` (``~/.cache`` when unset); not created here."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgetk" / name
