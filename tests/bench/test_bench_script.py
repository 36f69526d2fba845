"""scripts/bench's plumbing (no figures are asserted here: performance lives in docs/benchmarks.md, measured
side by side, never as timed assertions in tests)."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

from benchmarks.__main__ import record
from benchmarks.common import interleaved, update_doc

REPO = Path(__file__).resolve().parents[2]


def test_update_doc_rewrites_only_the_named_sections(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    update_doc({"convert": "old convert", "deploy": "old deploy"}, ["convert", "deploy"], doc=doc)
    text = doc.read_text()
    assert text.index("<!-- bench:machine -->") < text.index("<!-- bench:convert -->") < text.index(
        "<!-- bench:deploy -->")
    assert "- CPU:" in text and "- Python:" in text
    update_doc({"deploy": "new deploy $1 \\g<0>"}, ["convert", "deploy"], doc=doc)
    text = doc.read_text()
    assert "old convert" in text
    assert "old deploy" not in text
    assert "new deploy $1 \\g<0>" in text  # replacement text is taken literally
    assert text.count("<!-- bench:deploy -->") == 1


def test_interleaved_times_every_variant_in_every_round() -> None:
    calls: list[str] = []
    result = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, per_round=2,
                         warmup=1)
    assert result["a"].runs == result["b"].runs == 6
    # after the first call of each, rounds alternate: a's burst (1 warm-up + 2 timed), then b's
    assert calls[2:] == (["a"] * 3 + ["b"] * 3) * 3


def test_unknown_section_is_refused() -> None:
    proc = subprocess.run([str(REPO / "scripts" / "bench"), "nosuch"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "unknown section(s) nosuch" in proc.stderr and "convert" in proc.stderr


def test_sections_recorded_by_separate_runs_merge(tmp_path: Path) -> None:
    """Two runs of different sections (even at once) each replace only their own section and headline."""
    doc, headlines = tmp_path / "benchmarks.md", tmp_path / "benchmarks.json"
    headlines.write_text(json.dumps({"convert": {"old": 1}, "deploy": {"push_vs_best": 0.5}}))
    threads = [threading.Thread(target=record, args=(name, f"## {name} figures {i}", {"run": i}),
                                kwargs={"doc": doc, "headlines_path": headlines})
               for i, name in enumerate(["startup", "runner", "fleet", "optimize"] * 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    merged = json.loads(headlines.read_text())
    assert merged["convert"] == {"old": 1} and merged["deploy"] == {"push_vs_best": 0.5}
    assert {merged[n]["run"] for n in ("startup", "runner", "fleet", "optimize")} == {8, 9, 10, 11}
    text = doc.read_text()
    for i, name in enumerate(["startup", "runner", "fleet", "optimize"]):
        assert f"## {name} figures {i + 8}" in text and text.count(f"<!-- bench:{name} -->") == 1
    assert "0.50x" in text  # the summary is rebuilt from the merged headlines (the deploy entry kept)
    record("deploy", "## deploy failed", None, doc=doc, headlines_path=headlines)
    assert json.loads(headlines.read_text())["deploy"] == {"push_vs_best": 0.5}  # a failed run keeps the figures
    assert "## deploy failed" in doc.read_text()


def test_every_registered_section_has_a_module_with_a_title_and_run() -> None:
    import importlib

    from benchmarks.__main__ import SECTIONS

    for name in SECTIONS:
        module = importlib.import_module(f"benchmarks.{name}")
        assert isinstance(module.TITLE, str) and module.TITLE, name
        assert callable(module.run), name
