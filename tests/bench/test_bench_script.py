"""scripts/bench's plumbing (no figures are asserted here: performance lives in docs/benchmarks.md, measured
side by side, never as timed assertions in tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path

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
