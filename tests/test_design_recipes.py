"""docs/design.md's "Where a new thing goes" recipes name places in the code: each test here reads one recipe
and fails when a place it names is missing (one function per recipe)."""

from __future__ import annotations

import ast
import dataclasses
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"


def _recipe(title: str) -> str:
    """The bullet of "Where a new thing goes" that starts with ``- **title**`` (its continuation lines too)."""
    text = DESIGN.read_text()
    match = re.search(rf"^- \*\*{re.escape(title)}\*\*.*?(?=^- \*\*|^#|\Z)", text, re.M | re.S)
    assert match, f"docs/design.md has no recipe '{title}'"
    return match.group(0)


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

# --------------------------------------------------------------------------------------- add a board


def test_add_a_board_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path, table and name the board recipe names exists; and a board is one profile file: a new
    profile with a ``[match]`` table is what picks it for a probed device."""
    from toolkit import resources
    from toolkit.model import platform
    from toolkit.model.schemas import targets as schema
    from toolkit.model.targets import TargetProfile

    profile_keys = {f.name for f in dataclasses.fields(TargetProfile)}
    match_keys = {f.name for f in dataclasses.fields(schema.Match)}

    recipe = _recipe("A device kind")
    named = re.findall(r"`([^`]+)`", recipe)
    assert named, recipe
    for token in named:
        if "/" in token:
            assert (ROOT / token).exists(), f"the board recipe names {token}, which does not exist"
        elif token.startswith("["):
            assert token.strip("[]") in profile_keys, f"no profile table {token}"
        else:
            assert (hasattr(platform, token) or hasattr(schema, token) or token in match_keys), \
                f"the board recipe names {token}, which neither platform.py nor the profile schema has"

    shipped = tmp_path / "targets"
    shutil.copytree(resources.targets_dir(), shipped)
    text = (shipped / "generic-aarch64.toml").read_text().replace('name = "generic-aarch64"', 'name = "acme-board"')
    (shipped / "acme-board.toml").write_text(text + '\n[match]\nboards = ["acme board"]\n')
    monkeypatch.setattr(resources, "targets_dir", lambda: shipped)
    platform.board_matches.cache_clear()
    try:
        assert platform.match_profile(arch="aarch64", cpu_model="Cortex-A55", model_name="ACME Board rev 2") \
            == "acme-board"
        from toolkit.model.targets import get_profile

        assert get_profile("acme-board").name == "acme-board"  # the schema takes the [match] table
    finally:
        platform.board_matches.cache_clear()


# --------------------------------------------------------------------------------------- add a route


def test_add_a_route_recipe() -> None:
    from toolkit.conversion import base, routes

    recipe = _recipe("A new conversion route")
    fields = {f.name for f in dataclasses.fields(routes.Route)}
    for name in ("backend", "unbuilt", "a16w8_refusal", "default", "refusal"):
        assert f"`{name}`" in recipe, f"the recipe does not name the row's {name}"
        assert name in fields, f"the recipe names Route.{name}, which does not exist"
    assert "`_ROWS`" in recipe and routes._ROWS, "the recipe names routes._ROWS"
    assert hasattr(base, "ConversionRequest") and hasattr(base, "BuiltArtifact")
    for module in ("registry", "plan", "backend"):  # they read the row: a route needs nothing there
        assert f"`{module}`" in recipe
        tree = ast.parse((ROOT / "toolkit" / "conversion" / f"{module}.py").read_text())
        imports = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "toolkit.conversion.routes" in imports, f"conversion/{module}.py does not read routes.py"
    registry_test = ast.parse((ROOT / "tests" / "conversion" / "test_registry.py").read_text())
    names = {t.id for node in ast.walk(registry_test) if isinstance(node, ast.AnnAssign | ast.Assign)
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    assert "ROUTE_TESTS" in recipe and "ROUTE_TESTS" in names


# ---------------------------------------------------------------------------- add a format backend / a source


WALK = ("plan", "candidate", "crash_guard", "runtime_retry", "layer_probe", "graph_cuts", "selective", "tables",
        "write", "pipeline", "registry")  # the convert walk every route shares


def test_add_a_format_backend_recipe() -> None:
    """Every hook the recipe names is a method of ``Backend``; every backend package has its ``backend.py``, and the
    walk imports no backend package (it asks ``ConvertRun.backend``), so a new format touches only what the recipe
    says."""
    from toolkit.conversion.backend import Backend

    recipe = _recipe("A format backend")
    hooks = re.findall(r"`(\w+)`", recipe)
    for hook in ("build", "layer_table", "float_export", "default_io", "planned", "profile_refusal", "load_problems",
                 "device_only", "as_built", "numerics", "failing_ops", "cuts", "weight_layers", "nested_layers",
                 "locate", "probe_order", "probe_tensors", "probe_files", "probe_refusal", "bundled"):
        assert hook in hooks, f"the recipe does not name Backend.{hook}"
        assert hasattr(Backend, hook), f"the recipe names Backend.{hook}, which does not exist"
    conversion = ROOT / "toolkit" / "conversion"
    packages = [p for p in conversion.iterdir() if (p / "__init__.py").is_file()]
    assert {p.name for p in packages} == {"tflite", "onnx", "pt2e", "executorch"}
    for package in packages:
        assert (package / "backend.py").is_file(), f"{package.name}/ has no backend.py"
    for module in WALK:
        for imported in _imports(conversion / f"{module}.py"):
            assert not any(imported.startswith(f"toolkit.conversion.{p.name}") for p in packages), \
                f"conversion/{module}.py imports {imported}: ask the run's backend instead"


def test_add_a_source_format_recipe() -> None:
    recipe = _recipe("A new source format")
    for place in ("toolkit/sources/detect.py", "toolkit/conversion/onnx/backend.py"):
        assert f"`{place}`" in recipe and (ROOT / place).exists(), place
    from toolkit.conversion.onnx import backend as onnx_backend
    from toolkit.conversion.routes import ROUTES

    exports = {getattr(onnx_backend, name).export for name in dir(onnx_backend)
               if isinstance(getattr(onnx_backend, name), onnx_backend.OnnxBackend)}
    for export in exports:  # each float export the recipe's one line names is a module of the ONNX backend
        module = export.partition(":")[0]
        assert module.startswith("toolkit.conversion.onnx."), export
    frameworks_to_onnx = {fw for (fw, fmt), row in ROUTES.items() if fmt == "onnx" and row.backend}
    from toolkit.model.vocabulary import Framework

    assert frameworks_to_onnx == set(Framework), "a source format without its ONNX route"


# ------------------------------------------------------------------------------------- add a runtime


def test_add_a_runtime_recipe() -> None:
    from toolkit import device_side
    from toolkit.device_side import shared
    from toolkit.model.vocabulary import Runtime
    from toolkit.runtimes import execution, spec

    recipe = _recipe("A runtime")
    for place in ("toolkit/device_side/shared.py", "toolkit/runtimes/spec.py", "toolkit/delivery/provisioning.py",
                  "toolkit/runtimes/execution/", "toolkit/device_side/src/edgetk_runner.py",
                  "toolkit/device_side/src/runner/loaders.py", "tests/test_provisioning.py",
                  "tests/fixtures/device_envs.py"):
        assert f"`{place}`" in recipe or f" {place}" in recipe, f"the recipe does not name {place}"
        assert (ROOT / place).exists(), f"the recipe names {place}, which does not exist"
    assert "`RUNTIME_ROWS`" in recipe and "`RuntimeSpec`" in recipe and "`RUNTIME_SPECS`" in recipe
    assert {row["runtime"] for row in shared.RUNTIME_ROWS} == set(Runtime), "a runtime without its row"
    assert "toolkit.device_side.shared" in _imports(ROOT / "toolkit" / "runtimes" / "spec.py"), \
        "spec.py does not read the rows"
    fields = {f.name for f in dataclasses.fields(spec.RuntimeSpec)}
    assert {"format", "distributions", "module", "install_hint", "requirements"} <= fields
    assert "`vocabulary.Runtime`" in recipe and "`open_session`" in recipe and hasattr(execution, "open_session")
    assert "toolkit.runtimes.spec" in _imports(ROOT / "toolkit" / "delivery" / "provisioning.py"), \
        "setup does not read the rows"
    assert "runtime table" in device_side.ASSEMBLED[device_side.RUNNER_FILE], "the runner does not carry the rows"
    assert "`LOADER_CLASSES`" in recipe and "`Loader`" in recipe
    assert "LOADER_CLASSES" in _names(ROOT / "toolkit" / "device_side" / "src" / "runner" / "loaders.py")
    assert "test_every_runtime_row_has_its_loader_in_the_rows_order" in _names(ROOT / "tests" / "runner" /
                                                                               "test_blocks.py")
    assert "test_the_runner_and_setup_read_one_runtime_table" in _names(ROOT / "tests" / "test_provisioning.py")


# ------------------------------------------------------------------------------------- add a helper verb


def test_add_a_helper_verb_recipe() -> None:
    """The helper verb recipe's places exist, and a verb is what it says: a ``cmd_`` function in a helper block, its
    row in ``COMMANDS`` (in the cli block), called by the host through ``Device.helper``."""
    from toolkit import device_side

    recipe = _recipe("A device helper verb")
    for place in re.findall(r"`([^`\s]+/[^`\s]+)`", recipe):
        assert (ROOT / place).exists(), f"the recipe names {place}, which does not exist"
    assert "`COMMANDS`" in recipe and "`emit`" in recipe and "`fail`" in recipe and "`HelperRefusal`" in recipe
    cli = ROOT / "toolkit" / "device_side" / "src" / "helper" / "cli.py"
    assert "COMMANDS" in _names(cli) and cli in device_side.source_blocks(device_side.HELPER_FILE)
    answer = _names(ROOT / "toolkit" / "device_side" / "src" / "helper" / "answer.py")
    assert {"emit", "fail"} <= answer
    assert 'device.ask(StatusAnswer, "status")' in (ROOT / "toolkit" / "delivery" / "deployment.py").read_text()
    from toolkit.model import answers

    assert "`device.ask(TheAnswer," in recipe and dataclasses.is_dataclass(answers.StatusAnswer)
