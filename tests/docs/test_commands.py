"""The commands the README and the task guides show are run as they are written.

Every ``bash`` block of README.md and docs/guides/*.md is marked on the line before it:

- ``<!-- docs-test: local -->``: run here, in order, on the ``local`` device, in one workspace where
  ``model.keras`` is the trained digits CNN of the tests and ``calib.npz``, ``eval.npz``, ``labels.txt`` are the
  digits data shipped in calibration/digits/; every command must exit 0. The README's block converts once; the
  guides' identical convert is the conversion cache's (one model converted for the whole file);
- ``<!-- docs-test: hardware -->``: needs a real device (an address on a LAN): not run, but every command and
  option in it must exist (click parses each line, with ``--help`` appended so that nothing runs);
- ``<!-- docs-test: suite -->``: the set-up scripts, each run by a test of its own (tests/test_quickstart.py
  runs ./scripts/quickstart; ./scripts/test is the suite itself).

An unmarked block that shows ``edgetk`` fails. The inventory of the fleet guide is its own ``toml`` block.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.fixtures.cli import run_edgetk
from toolkit.cli import cli

REPO = Path(__file__).resolve().parents[2]
GUIDES = ("convert", "target", "deploy", "fleet", "check", "report")  # the order a reader follows
PAGES = (REPO / "README.md", *(REPO / "docs" / "guides" / f"{name}.md" for name in GUIDES))
BLOCK = re.compile(r"(?:^|\n)(<!-- docs-test: \w+ -->\n)?```(\w*)\n(.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    page: str
    kind: str  # local | hardware | suite
    commands: tuple[tuple[str, ...], ...]


def _commands(body: str) -> tuple[tuple[str, ...], ...]:
    out = []
    for line in body.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(tuple(words))
    return tuple(out)


def blocks(page: Path) -> list[Block]:
    """The marked shell blocks of a page, in order; an unmarked shell block that shows edgetk fails."""
    found = []
    for match in BLOCK.finditer(page.read_text()):
        mark, language, body = match.groups()
        if language not in ("bash", "sh", "console", "shell"):
            continue
        name = page.relative_to(REPO).as_posix()
        assert mark is not None or "edgetk" not in body, f"{name}: an unmarked command block:\n{body}"
        if mark is not None:
            kind = mark.removeprefix("<!-- docs-test: ").split(" ")[0]
            assert kind in ("local", "hardware", "suite"), (name, kind)
            found.append(Block(name, kind, _commands(body)))
    return found


ALL = [block for page in PAGES for block in blocks(page)]


@pytest.mark.fast
def test_every_page_has_marked_blocks_and_the_readme_a_local_one() -> None:
    assert {b.page for b in ALL} == {p.relative_to(REPO).as_posix() for p in PAGES}
    readme = [b for b in ALL if b.page == "README.md"]
    assert [b.kind for b in readme] == ["suite", "local", "hardware"]
    assert all(c[0] == "edgetk" for b in ALL if b.kind != "suite" for c in b.commands)


@pytest.mark.fast
def test_hardware_commands_exist_with_every_option() -> None:
    """Parsed by click with --help appended: an unknown command or option fails (exit 2), nothing runs."""
    runner = CliRunner()
    hardware = [c for b in ALL if b.kind == "hardware" for c in b.commands]
    assert len(hardware) >= 8
    for command in hardware:
        result = runner.invoke(cli, [*command[1:], "--help"])
        assert result.exit_code == 0, (command, result.output)
        assert "Usage: " in result.output


@pytest.mark.fast
def test_suite_blocks_are_run_by_their_tests() -> None:
    scripts = {c[0] for b in ALL if b.kind == "suite" for c in b.commands}
    assert scripts == {"./scripts/quickstart", "./scripts/test"}
    assert '"quickstart"' in (REPO / "tests" / "test_quickstart.py").read_text()
    for script in scripts:
        assert os.access(REPO / script, os.X_OK), script


def _fleet_inventory() -> str:
    match = re.search(r"```toml\n(.*?)```", (REPO / "docs" / "guides" / "fleet.md").read_text(), re.S)
    assert match, "the fleet guide shows its inventory as a toml block"
    return match.group(1)


@pytest.fixture
def workspace(tmp_path: Path, digits_keras: Path) -> Path:
    """What a reader has: a model, calibration and eval data, class names; the fleet guide's inventory."""
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(digits_keras, ws / "model.keras")
    data = REPO / "calibration" / "digits"
    shutil.copy(data / "calibration.npz", ws / "calib.npz")
    shutil.copy(data / "eval.npz", ws / "eval.npz")
    shutil.copy(data / "labels.txt", ws / "labels.txt")
    (ws / "devices.toml").write_text(_fleet_inventory())
    return ws


def test_local_commands_of_the_readme_and_the_guides_run(workspace: Path, tmp_path: Path) -> None:
    """Each page's check history is its own (EDGETK_STORE), so that no page's check is gated against another
    page's timing on this shared machine; the report guide reads what the check guide stored."""
    if os.uname().machine != "x86_64":
        pytest.skip("the pages show the generic-x86_64 profile; the bundle would be refused on this arch")
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "PYTHONPATH": str(REPO)}  # this checkout's toolkit, whatever the environment has installed
    ran = 0
    for block in (b for b in ALL if b.kind == "local"):
        page = Path(block.page).stem
        store = "check" if page == "report" else page
        for command in block.commands:
            started = time.perf_counter()
            result = run_edgetk(*command[1:], cwd=workspace,
                                env={**env, "EDGETK_STORE": str(tmp_path / f"history-{store}.sqlite")}, timeout=600)
            assert result.code == 0, (block.page, " ".join(command), result.stdout[-3000:], result.stderr[-3000:])
            print(f"{time.perf_counter() - started:6.1f} s  {block.page}: {' '.join(command)}", file=sys.stderr)
            ran += 1
    assert ran >= 12
    bundle = workspace / "bundles" / "model-generic-x86_64"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert any(a["precision"] == "int8" for a in manifest["artifacts"])
    assert (workspace / "report.html").stat().st_size > 10_000 and (workspace / "history.html").is_file()
    assert (home / ".edgetk").is_dir()  # `local` installed the bundle in this HOME, nowhere else
