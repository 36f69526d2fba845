"""The on-device runner's source is blocks (toolkit/device_side/src/runner/*.py) assembled into one shipped file:
each block stays small, the blocks type-check on the host, every runtime row has its loader, and only the loader
blocks name a runtime or a format. Nothing here runs a runtime; tests/runner/test_runner.py runs the assembled file
in device envs."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from toolkit import device_side
from toolkit.device_side import shared
from toolkit.model.vocabulary import Format
from toolkit.runtimes.spec import runtimes_for

REPO = Path(__file__).resolve().parents[2]
BLOCK_DIR = device_side.SRC_DIR / "runner"
MAX_BLOCK_LINES = 600
# The blocks that may name a runtime or a format: the loaders (one block per runtime, the TFLite ones' common
# block, ExecuTorch's two paths) and the loader table. The measuring code asks its loader instead.
LOADER_BLOCKS = {"tflite", "litert", "tflite_runtime", "tensorflow", "onnxruntime", "pte", "executorch",
                 "executorch_native", "executorch_binding", "loaders"}


def _assembled_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("edgetk_runner_blocks",
                                                  device_side.source_path(device_side.RUNNER_FILE))
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    return runner


def _top_level_names(tree: ast.Module) -> set[str]:
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return names | {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
                    if isinstance(target, ast.Name)}


def test_each_block_is_named_once_and_at_most_600_lines() -> None:
    named = device_side.runner_blocks()
    assert len(named) == len(set(named)), "a block line twice in src/edgetk_runner.py"
    on_disk = {path for path in BLOCK_DIR.glob("*.py") if path.name != "__init__.py"}
    assert set(named) == on_disk, "every block file is named by one block line, and every block line by a file"
    sizes = {path.name: len(path.read_text().splitlines()) for path in [device_side.SRC_DIR / "edgetk_runner.py",
                                                                        *named]}
    too_big = {name: lines for name, lines in sizes.items() if lines > MAX_BLOCK_LINES}
    assert not too_big, f"blocks over {MAX_BLOCK_LINES} lines: {too_big}"


def test_the_shipped_file_holds_no_host_lines() -> None:
    """What is above each block's SHIPPED line (its imports of the other blocks) stays on the host."""
    text = device_side.source_path(device_side.RUNNER_FILE).read_text()
    tree = ast.parse(text)
    relative = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, f"relative imports in the shipped runner at lines {relative}"
    assert device_side.SHIPPED not in text
    shipped = _top_level_names(tree)
    for block in device_side.runner_blocks():
        missing = _top_level_names(ast.parse(device_side.shipped_text(block))) - shipped
        assert not missing, f"{block.name} defines {missing}, which the shipped file lacks"


def _block_imports(block: Path) -> dict[str, int]:
    """The blocks ``block`` imports names from (above its SHIPPED line, for the type checker), each with its line."""
    head = block.read_text().split(device_side.SHIPPED, 1)[0]
    return {node.module: node.lineno for node in ast.parse(head).body
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}


def test_each_block_imports_only_from_the_blocks_before_it() -> None:
    """One way, top to bottom: a block takes names only from the blocks inlined before it, so the blocks form no
    import circle. A block that must call one further down owns a table that one fills (the loader table,
    LOADERS), or is called by it (check and run are called by the command line, not the other way round)."""
    order = [block.stem for block in device_side.runner_blocks()]
    backward = [f"{block.name}:{line} imports from {module}.py, which is not inlined before it"
                for position, block in enumerate(device_side.runner_blocks())
                for module, line in _block_imports(block).items()
                if module not in order[:position]]
    assert not backward, "blocks import only from the blocks before them in src/edgetk_runner.py: " + "; ".join(
        backward)


def test_the_blocks_type_check_for_the_device() -> None:
    """mypy over the blocks with src/mypy.ini (the oldest Python mypy targets; vermin holds the file to 3.6)."""
    cache = os.environ.get("EDGETK_TEST_CACHE")
    args = ["--cache-dir", str(Path(cache) / "mypy-device")] if cache else []
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(device_side.SRC_DIR / "mypy.ini"),
                             *args], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    checked = len(device_side.runner_blocks()) + 1  # and the package's __init__
    assert f"no issues found in {checked} source files" in result.stdout, result.stdout


def test_every_runtime_row_has_its_loader_in_the_rows_order() -> None:
    runner = _assembled_runner()
    assert [loader.runtime for loader in runner.LOADERS] == [row["runtime"] for row in shared.RUNTIME_ROWS]
    for fmt in Format:
        assert tuple(loader.runtime for loader in runner.loaders_for(fmt.value)) == runtimes_for(fmt)
        assert all(loader.format == fmt.value for loader in runner.loaders_for(fmt.value))
    assert set(runner.SHARED_IMPORT_FORMATS) == {"pte"}  # ExecuTorch's binding imports torch: one import per check


def test_only_the_loader_blocks_name_a_runtime_or_a_format() -> None:
    """A comparison or a membership test against a runtime's or a format's name lives in a loader block."""
    words = {row["runtime"] for row in shared.RUNTIME_ROWS} | {row["format"] for row in shared.RUNTIME_ROWS}
    found = []
    for block in device_side.runner_blocks():
        if block.stem in LOADER_BLOCKS:
            continue
        for node in ast.walk(ast.parse(device_side.shipped_text(block))):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    names = {elt.value for elt in getattr(side, "elts", [side]) if isinstance(elt, ast.Constant)}
                    if names & words:
                        found.append(f"{block.name}:{node.lineno}")
    assert not found, f"branches on a runtime or format name outside the loader blocks: {found}"
