"""Where the shipped data (target profiles, calibration sets) lives: inside the wheel as package data
(``toolkit/_data/``), or at the top level of a source checkout (``targets/``, ``calibration/``)."""

from __future__ import annotations

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
