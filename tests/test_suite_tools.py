"""The suite's own tools: ``scripts/test-times`` (where the time goes) and the workers' order and groups
(tests/fixtures/workers.py), and the cache of converted products (tests/fixtures/products.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import workers

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "test-times"

pytestmark = [pytest.mark.fast, pytest.mark.quick]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4" time="30.5">
<testcase classname="tests.arm.test_pi" name="test_a" time="20.0"/>
<testcase classname="tests.arm.test_pi" name="test_b" time="5.0"><failure message="x"/></testcase>
<testcase classname="tests.test_c" name="test_d[1]" time="3.0"/>
<testcase classname="tests.test_c" name="test_e" time="0.5"><skipped message="y"/></testcase>
</testsuite></testsuites>
"""


def _reports(tmp_path: Path) -> Path:
    (tmp_path / "junit-parallel.xml").write_text(JUNIT)
    records = [
        {"kind": "fixture", "fixture": "arm_pi", "scope": "session", "test": "tests/arm/test_pi.py::test_a",
         "seconds": 12.0, "worker": "gw0"},
        {"kind": "fixture", "fixture": "tmp_path", "scope": "function", "test": "x", "seconds": 0.1, "worker": "gw0"},
        {"kind": "fixture", "fixture": "tmp_path", "scope": "function", "test": "y", "seconds": 0.1, "worker": "gw1"},
        {"kind": "phase", "test": "tests/arm/test_pi.py::test_a", "when": "setup", "seconds": 12.5,
         "outcome": "passed", "worker": "gw0"},
        {"kind": "phase", "test": "tests/arm/test_pi.py::test_a", "when": "call", "seconds": 7.5,
         "outcome": "passed", "worker": "gw0"},
    ]
    (tmp_path / "times-gw0-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # two samples 10 s apart: 150 of 200 ticks busy (idle 40 + iowait 10)
    (tmp_path / "cpu.log").write_text("cpus 2\n100 cpu 0 0 0 0 0 0 0 0 1.0\n110 cpu 100 0 50 40 10 0 0 0 2.0\n")
    return tmp_path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_test_times_groups_by_module_and_fixture(tmp_path: Path) -> None:
    result = _run(str(_reports(tmp_path)))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "| tests/arm/test_pi.py | 2 | 25.0 | 87.7% |" in out  # 25 of 28.5 s
    assert "| tests/test_c.py | 2 | 3.5 | 12.3% |" in out
    assert "| arm_pi | session | 1 | 12.0 |" in out and "| tmp_path | function | 2 | 0.2 |" in out
    assert "Set-up phases 12 s, test bodies 8 s." in out
    assert "| tests/arm/test_pi.py::test_a | 20.0 | passed |" in out.split("## Slowest tests")[1]
    assert "10 s logged on 2 CPUs: 75% busy on average (1.50 of 2 cores), mean 1-minute load 1.50." in out


def test_test_times_closing_line_and_durations(tmp_path: Path) -> None:
    reports = _reports(tmp_path)
    line = _run(str(reports), "--closing-line")
    assert line.stdout == "total: 2 passed, 1 failed, 1 skipped\n"
    written = tmp_path / "durations.json"
    assert _run(str(reports), "--write-durations", str(written)).returncode == 0
    doc = json.loads(written.read_text())
    assert doc["modules"] == {"tests/arm/test_pi.py": 25.0, "tests/test_c.py": 3.5}
    assert doc["quick"] == {"tests/arm/test_pi.py": "tests/arm/test_pi.py::test_a",  # test_b failed
                            "tests/test_c.py": "tests/test_c.py::test_d[1]"}  # test_e was skipped


def test_test_times_names_a_missing_report_directory(tmp_path: Path) -> None:
    result = _run(str(tmp_path / "nope"))
    assert result.returncode == 2 and "run .ci/run first" in result.stderr and "Traceback" not in result.stderr


class _Item:
    """What the collection hook reads and writes of a pytest item."""

    def __init__(self, nodeid: str, *, timing: bool = False) -> None:
        self.nodeid = nodeid
        self.marks: list[Any] = [pytest.mark.timing.mark] if timing else []

    def get_closest_marker(self, name: str) -> Any:
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, mark: Any) -> None:
        self.marks.append(mark.mark)


def test_workers_run_a_module_whole_and_the_longest_groups_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "quick_picks",
                        lambda: {"tests/b.py": "tests/b.py::t2", "tests/a.py": "tests/a.py::t0"})
    monkeypatch.setattr(workers, "known_durations", lambda: {
        "tests/a.py": 5.0, "tests/b.py": 50.0, "tests/arm/test_emulated_pi.py": 30.0,
        "tests/arm/test_pte_emulated_pi.py": 30.0})
    items = [_Item("tests/a.py::t0", timing=True), _Item("tests/a.py::t1"), _Item("tests/arm/test_emulated_pi.py::t"),
             _Item("tests/a.py::t2"), _Item("tests/new.py::t"), _Item("tests/b.py::t1"), _Item("tests/arm/test_pte_emulated_pi.py::t"),
             _Item("tests/b.py::t2"), _Item("tests/c.py::t")]
    workers.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    order = [i.nodeid for i in items]
    # the emulated Pi's two modules are one group (60 s) and go first; then b (50 s), a (5 s); unknown ones keep
    # their collection order at the end; each module's tests stay in their order
    assert order == ["tests/arm/test_emulated_pi.py::t", "tests/arm/test_pte_emulated_pi.py::t", "tests/b.py::t1",
                     "tests/b.py::t2", "tests/a.py::t0", "tests/a.py::t1", "tests/a.py::t2", "tests/new.py::t",
                     "tests/c.py::t"]
    groups = {i.nodeid: workers.group_of(i.nodeid) for i in items}
    assert groups["tests/a.py::t1"] == groups["tests/a.py::t2"] == "tests/a.py"
    assert groups["tests/arm/test_pte_emulated_pi.py::t"] == groups["tests/arm/test_emulated_pi.py::t"] == "emulated-pi"
    quick = [i.nodeid for i in items if i.get_closest_marker("quick")]
    assert sorted(quick) == ["tests/a.py::t1", "tests/arm/test_emulated_pi.py::t",
                             "tests/arm/test_pte_emulated_pi.py::t", "tests/b.py::t2", "tests/c.py::t",
                             "tests/new.py::t"]  # the file's pick, else (a's pick is timing) the first other


def test_the_durations_file_names_modules_that_exist() -> None:
    """tests/durations.json orders the workers; a module renamed or removed since it was written is only noise."""
    known = workers.known_durations()
    assert known, "tests/durations.json is missing or empty: scripts/test-times --write-durations writes it"
    missing = [m for m in known if not (REPO / m).is_file()]
    assert len(missing) <= len(known) // 10, missing


def test_a_cached_product_is_built_once_per_recipe_and_never_half(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    """``built_once`` (the converted .pte bundles): one build per key, reused; a build that fails leaves no product
    a later run could read; ``product_key`` changes with a toolkit source, a recipe file and a package version."""
    from tests.fixtures import products

    monkeypatch.setenv("EDGETK_TEST_CACHE", str(tmp_path / "cache"))
    builds: list[Path] = []

    def build(folder: Path) -> None:
        builds.append(folder)
        (folder / "model.pte").write_text(f"build {len(builds)}")

    first = products.built_once(tmp_path_factory, "pte-x", "k1", build)
    again = products.built_once(tmp_path_factory, "pte-x", "k1", build)
    assert first == again and len(builds) == 1 and (first / "model.pte").read_text() == "build 1"
    other = products.built_once(tmp_path_factory, "pte-x", "k2", build)
    assert other != first and len(builds) == 2

    def broken(folder: Path) -> None:
        (folder / "model.pte").write_text("half")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError):
        products.built_once(tmp_path_factory, "pte-x", "k3", broken)
    assert not list((tmp_path / "cache").glob("pte-x-k3*"))
    assert products.built_once(tmp_path_factory, "pte-x", "k3", build) and len(builds) == 3

    checkout = tmp_path / "checkout"
    (checkout / "toolkit" / "conversion").mkdir(parents=True)
    (checkout / "targets").mkdir()
    recipe = checkout / "recipe.py"
    recipe.write_text("EPOCHS = 12\n")
    converter = checkout / "toolkit" / "conversion" / "pte.py"
    converter.write_text("def convert(): ...\n")
    monkeypatch.setattr(products, "CHECKOUT", checkout)
    key = products.product_key(recipe, packages=("numpy",))
    assert products.product_key(recipe, packages=("numpy",)) == key
    converter.write_text("def convert(): return 1\n")
    changed = products.product_key(recipe, packages=("numpy",))
    recipe.write_text("EPOCHS = 13\n")
    assert len({key, changed, products.product_key(recipe, packages=("numpy",)),
                products.product_key(recipe, packages=("numpy", "pytest"))}) == 4
