"""docs/design.md's "Where a new thing goes" recipes stay true: each place a recipe names exists."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _recipe(start: str) -> str:
    design = (ROOT / "docs" / "design.md").read_text()
    recipe = design[design.index(start):]
    return recipe[:recipe.index("\n- **", 1)]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def _names(path: Path) -> set[str]:
    """The functions and assigned names defined in ``path``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_add_a_runtime_recipe() -> None:
    from toolkit.model.types import Runtime
    from toolkit.runtimes import execution, spec

    recipe = _recipe("- **A runtime**")
    for place in ("toolkit/runtimes/spec.py", "toolkit/delivery/provisioning.py", "toolkit/runtimes/execution/",
                  "toolkit/device_side/src/edgetk_runner.py", "tests/test_provisioning.py",
                  "tests/fixtures/device_envs.py"):
        assert f"`{place}`" in recipe or f" {place}" in recipe, f"the recipe does not name {place}"
        assert (ROOT / place).exists(), f"the recipe names {place}, which does not exist"
    assert "`RuntimeSpec`" in recipe and "`RUNTIME_SPECS`" in recipe
    assert {row.runtime for row in spec.RUNTIME_SPECS} == set(Runtime), "a runtime without its row"
    fields = {f.name for f in dataclasses.fields(spec.RuntimeSpec)}
    assert {"format", "distributions", "module", "install_hint", "requirements"} <= fields
    assert "`types.Runtime`" in recipe and "`open_session`" in recipe and hasattr(execution, "open_session")
    assert "toolkit.runtimes.spec" in _imports(ROOT / "toolkit" / "delivery" / "provisioning.py"), \
        "setup does not read the rows"
    runner = _names(ROOT / "toolkit" / "device_side" / "src" / "edgetk_runner.py")
    for name in ("_PACKAGES", "INSTALL_HINTS"):
        assert f"`{name}`" in recipe and name in runner, f"the runner has no {name}"
    assert "test_the_runner_and_setup_read_one_runtime_table" in _names(ROOT / "tests" / "test_provisioning.py")
