"""The package stays mypy-clean (the configuration is in pyproject.toml; the on-device runner, which must run on
Python 3.6, is checked for syntax by vermin in tests/runner, and its blocks by mypy with their own configuration in
tests/runner/test_blocks.py)."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import tokenize
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


# ``Any`` uses in toolkit/ (every ``Any`` name and ``typing.Any`` attribute, device_side/ excluded: it is not
# type-checked on the host). 646 at 30cf74d (issue 36's baseline), 537 when the count began to fall. A ceiling
# that only goes down: lower it when a change removes uses, never raise it (a new ``Any`` needs a precise type,
# ``object`` or a Protocol first; docs/design.md, "Typing").
ANY_CEILING = 289
TOOLKIT = REPO / "toolkit"


def _any_uses(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if (isinstance(node, ast.Name) and node.id == "Any")
            or (isinstance(node, ast.Attribute) and node.attr == "Any")]


def _host_modules() -> list[Path]:
    return [p for p in sorted(TOOLKIT.rglob("*.py")) if "device_side" not in p.relative_to(TOOLKIT).parts]


def test_any_uses_stay_under_the_ceiling() -> None:
    counts = {p: len(_any_uses(ast.parse(p.read_text(encoding="utf-8")))) for p in _host_modules()}
    total = sum(counts.values())
    worst = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert total <= ANY_CEILING, (
        f"{total} uses of Any in toolkit/ (ceiling {ANY_CEILING}); the most: "
        + ", ".join(f"{p.relative_to(REPO)} {n}" for p, n in worst))


def test_each_module_using_any_says_why() -> None:
    """A module that uses ``Any`` gives its reason in a comment or docstring (``# Any: TensorFlow is untyped``),
    once for the module or beside each use."""
    silent = []
    for path in _host_modules():
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        if not _any_uses(tree):
            continue
        comments = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                    if tok.type == tokenize.COMMENT]
        docstrings = [ast.get_docstring(node) or "" for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        strings = [node.value for node in ast.walk(tree)  # attribute docstrings (a string under an assignment)
                   if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                   and isinstance(node.value.value, str)]
        if not any("Any" in text for text in [*comments, *docstrings, *strings]):
            silent.append(str(path.relative_to(REPO)))
    assert not silent, f"modules using Any without saying why: {silent}"
