"""docs/design.md's "Where a new thing goes" recipes stay true: each place a recipe names exists."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_add_a_route_recipe() -> None:
    from toolkit.conversion import base, routes

    design = (ROOT / "docs" / "design.md").read_text()
    recipe = design[design.index("- **A new conversion route**"):]
    recipe = recipe[:recipe.index("\n- **")]
    fields = {f.name for f in dataclasses.fields(routes.Route)}
    for name in ("builder", "unbuilt", "a16w8_refusal", "default", "float_export", "layer_table", "refusal"):
        assert f"`{name}`" in recipe, f"the recipe does not name the row's {name}"
        assert name in fields, f"the recipe names Route.{name}, which does not exist"
    assert "`_ROWS`" in recipe and routes._ROWS, "the recipe names routes._ROWS"
    assert hasattr(base, "ConversionRequest") and hasattr(base, "BuiltArtifact")
    for module in ("registry", "plan", "layers"):  # they read the row: a route needs nothing there
        assert f"`{module}`" in recipe
        tree = ast.parse((ROOT / "toolkit" / "conversion" / f"{module}.py").read_text())
        imports = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "toolkit.conversion.routes" in imports, f"conversion/{module}.py does not read routes.py"
    registry_test = ast.parse((ROOT / "tests" / "conversion" / "test_registry.py").read_text())
    names = {t.id for node in ast.walk(registry_test) if isinstance(node, ast.AnnAssign | ast.Assign)
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    assert "ROUTE_TESTS" in recipe and "ROUTE_TESTS" in names
