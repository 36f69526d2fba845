"""Work shared by the optimization tests: the one Keras pruning run (through the real CLI) whose JSON report
the CLI test reads and whose output file the pruning test inspects, so the Keras fine-tune runs once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cli import run_edgetk


@dataclass(frozen=True)
class PrunedRun:
    code: int
    stderr: str
    doc: dict[str, Any] | None
    out: Path


@pytest.fixture(scope="session")
def keras_pruned_cli(digits_keras, digits_keras_train, digits_eval, tmp_path_factory) -> PrunedRun:  # type: ignore[no-untyped-def]
    """``edgetk optimize DIGITS --prune 0.6 --epochs 1 --json`` (fine-tuned on the digits, eval on held-out)."""
    out = tmp_path_factory.mktemp("pruned") / "pruned.keras"
    result = run_edgetk("optimize", digits_keras, "--prune", "0.6", "--train-data", digits_keras_train,
                        "--eval-data", digits_eval, "--epochs", "1", "--out", out, "--json")
    return PrunedRun(result.code, result.stderr, result.json() if result.code == 0 else None, out)
