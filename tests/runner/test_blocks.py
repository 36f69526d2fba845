"""The on-device runner's and the device helper's sources are blocks (toolkit/device_side/src/runner/*.py and
src/helper/*.py) assembled into one shipped file each: each block stays small, imports one way, and type-checks on
the host; every runtime row has its loader, only the runner's loader blocks name a runtime or a format, and every
helper verb is one row. Nothing here runs a runtime; tests/runner/test_runner.py runs the assembled runner in device
envs, tests/test_deployment.py and tests/devices/ the assembled helper."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from toolkit import device_side
from toolkit.device_side import shared
from toolkit.model.vocabulary import Format
from toolkit.runtimes.spec import runtimes_for

REPO = Path(__file__).resolve().parents[2]
# the shipped files written as blocks (their src/ file names them by block lines)
ASSEMBLED_FROM_BLOCKS = tuple(name for name in device_side.ASSEMBLED if device_side.source_blocks(name))
MAX_BLOCK_LINES = 600
# The blocks that may name a runtime or a format: the loaders (one block per runtime, the TFLite ones' common
# block, ExecuTorch's two paths) and the loader table. The measuring code asks its loader instead.
LOADER_BLOCKS = {"tflite", "litert", "tflite_runtime", "tensorflow", "onnxruntime", "pte", "executorch",
                 "executorch_native", "executorch_binding", "loaders"}


def _assembled(name: str = device_side.RUNNER_FILE) -> ModuleType:
    spec = importlib.util.spec_from_file_location("edgetk_assembled_blocks", device_side.source_path(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _top_level_names(tree: ast.Module) -> set[str]:
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return names | {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
                    if isinstance(target, ast.Name)}


def test_the_runner_and_the_helper_are_written_as_blocks() -> None:
    assert set(ASSEMBLED_FROM_BLOCKS) == {device_side.RUNNER_FILE, device_side.HELPER_FILE}


@pytest.mark.parametrize("name", ASSEMBLED_FROM_BLOCKS)
def test_each_block_is_named_once_and_at_most_600_lines(name: str) -> None:
    named = device_side.source_blocks(name)
    assert len(named) == len(set(named)), f"a block line twice in src/{name}"
    folders = {path.parent for path in named}
    assert len(folders) == 1, f"src/{name}'s blocks lie in one folder, not {sorted(map(str, folders))}"
    on_disk = {path for path in folders.pop().glob("*.py") if path.name != "__init__.py"}
    assert set(named) == on_disk, "every block file is named by one block line, and every block line by a file"
    sizes = {path.name: len(path.read_text().splitlines()) for path in [device_side.SRC_DIR / name, *named]}
    too_big = {name: lines for name, lines in sizes.items() if lines > MAX_BLOCK_LINES}
    assert not too_big, f"blocks over {MAX_BLOCK_LINES} lines: {too_big}"


@pytest.mark.parametrize("name", ASSEMBLED_FROM_BLOCKS)
def test_the_shipped_file_holds_no_host_lines(name: str) -> None:
    """What is above each block's SHIPPED line (its imports of the other blocks) stays on the host."""
    text = device_side.source_path(name).read_text()
    tree = ast.parse(text)
    relative = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, f"relative imports in the shipped runner at lines {relative}"
    assert device_side.SHIPPED not in text
    shipped = _top_level_names(tree)
    for block in device_side.source_blocks(name):
        missing = _top_level_names(ast.parse(device_side.shipped_text(block))) - shipped
        assert not missing, f"{block.name} defines {missing}, which the shipped file lacks"


def _block_imports(block: Path) -> dict[str, int]:
    """The blocks ``block`` imports names from (above its SHIPPED line, for the type checker), each with its line."""
    head = block.read_text().split(device_side.SHIPPED, 1)[0]
    return {node.module: node.lineno for node in ast.parse(head).body
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}


@pytest.mark.parametrize("name", ASSEMBLED_FROM_BLOCKS)
def test_each_block_imports_only_from_the_blocks_before_it(name: str) -> None:
    """One way, top to bottom: a block takes names only from the blocks inlined before it, so the blocks form no
    import circle. A block that must call one further down owns a table that one fills (the loader table,
    LOADERS), or is called by it (check and run are called by the command line, not the other way round; the
    helper's verbs by its COMMANDS)."""
    order = [block.stem for block in device_side.source_blocks(name)]
    backward = [f"{block.name}:{line} imports from {module}.py, which is not inlined before it"
                for position, block in enumerate(device_side.source_blocks(name))
                for module, line in _block_imports(block).items()
                if module not in order[:position]]
    assert not backward, f"blocks import only from the blocks before them in src/{name}: " + "; ".join(backward)


def test_the_blocks_type_check_for_the_device() -> None:
    """mypy over the blocks with src/mypy.ini (the oldest Python mypy targets; vermin holds the file to 3.6)."""
    cache = os.environ.get("EDGETK_TEST_CACHE")
    args = ["--cache-dir", str(Path(cache) / "mypy-device")] if cache else []
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(device_side.SRC_DIR / "mypy.ini"),
                             *args], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    checked = sum(len(device_side.source_blocks(name)) + 1 for name in ASSEMBLED_FROM_BLOCKS)  # and each __init__
    assert f"no issues found in {checked} source files" in result.stdout, result.stdout


def test_every_runtime_row_has_its_loader_in_the_rows_order() -> None:
    runner = _assembled()
    assert [loader.runtime for loader in runner.LOADERS] == [row["runtime"] for row in shared.RUNTIME_ROWS]
    for fmt in Format:
        assert tuple(loader.runtime for loader in runner.loaders_for(fmt.value)) == runtimes_for(fmt)
        assert all(loader.format == fmt.value for loader in runner.loaders_for(fmt.value))
    assert set(runner.SHARED_IMPORT_FORMATS) == {"pte"}  # ExecuTorch's binding imports torch: one import per check


def test_only_the_loader_blocks_name_a_runtime_or_a_format() -> None:
    """A comparison or a membership test against a runtime's or a format's name lives in a loader block."""
    words = {row["runtime"] for row in shared.RUNTIME_ROWS} | {row["format"] for row in shared.RUNTIME_ROWS}
    found = []
    for block in device_side.source_blocks(device_side.RUNNER_FILE):
        if block.stem in LOADER_BLOCKS:
            continue
        for node in ast.walk(ast.parse(device_side.shipped_text(block))):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    names = {elt.value for elt in getattr(side, "elts", [side]) if isinstance(elt, ast.Constant)}
                    if names & words:
                        found.append(f"{block.name}:{node.lineno}")
    assert not found, f"branches on a runtime or format name outside the loader blocks: {found}"


def test_every_helper_verb_is_one_row_of_its_function() -> None:
    """A helper verb is a ``cmd_<verb>`` function in the block of its job and its row in COMMANDS (the cli block):
    no verb without its function, no ``cmd_`` function without its verb, the cli block defining none itself."""
    helper = _assembled(device_side.HELPER_FILE)
    assert all(function.__name__ == f"cmd_{verb}" for verb, function in helper.COMMANDS.items()), helper.COMMANDS
    blocks = device_side.source_blocks(device_side.HELPER_FILE)
    defined = {node.name: block.stem for block in blocks for node in ast.parse(device_side.shipped_text(block)).body
               if isinstance(node, ast.FunctionDef) and node.name.startswith("cmd_")}
    assert set(defined) == {f"cmd_{verb}" for verb in helper.COMMANDS}
    assert blocks[-1].stem == "cli" and "cli" not in defined.values()


def test_the_helper_starts_with_its_heads_imports_only() -> None:
    """The helper runs once or twice per push with ``python -S``: its start-up imports are its head's and the probe
    block's stdlib modules; the blocks' typing imports (for their type comments) stay on the host."""
    tree = ast.parse(device_side.source_path(device_side.HELPER_FILE).read_text())
    imported = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert imported == {"json", "os", "platform", "re", "shutil", "struct", "sys", "time"}, imported
