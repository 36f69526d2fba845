"""The README is the front door: short, every link landing on a file of this repository, and its headline figures
the ones docs/benchmarks.json holds, each with the CPU it was measured on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
MAX_WORDS = 1200  # read in five minutes (issue 37)


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match, title
    return match.group(1)


def test_the_readme_is_short() -> None:
    assert len(README.split()) <= MAX_WORDS  # as `wc -w` counts


def test_every_link_of_the_readme_lands_on_a_file() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert len(links) >= 10
    for link in links:
        assert not link.startswith(("http:", "https:", "/")), link
        assert link.startswith("docs/"), f"{link}: the site's home page is this README, so it links only into docs/"
        assert (REPO / link).is_file(), link


# (words that find the bullet, where the figure is in benchmarks.json, how the README writes it, the CPU: the words
# the bullet uses for it, and the flag benchmarks.json's measured_on must (True) or must not (False) list)
HEADLINES = (
    ("ExecuTorch", ("pte", "int8_vs_fp32", "MobileNet-like executorch"), "{:.2f}x",
     ("AVX-512 VNNI", "avx512_vnni", True)),
    ("edgetk convert", ("convert_time", "ratio"), "{:.2f}x", ("AMX", "amx_int8", True)),
    ("push of a 50 MB bundle", ("deploy", "push_vs_best"), "{:.2f}x", ("AVX2", "avx512_vnni", False)),
)


def test_the_headline_figures_are_the_measured_ones_with_their_cpu() -> None:
    bench = json.loads((REPO / "docs" / "benchmarks.json").read_text())
    bullets = re.findall(r"^- (.*?)(?=^- |\Z)", _section("Measured"), re.S | re.M)
    assert len(bullets) == len(HEADLINES)
    for needle, path, form, (cpu_words, flag, present) in HEADLINES:
        (bullet,) = [" ".join(b.split()) for b in bullets if needle in b]
        value = bench
        for key in path:
            value = value[key]
        assert f"**{form.format(value)}**" in bullet, (needle, value, bullet)
        measured_on = bench[path[0]]["measured_on"]
        vendor = next(v for v in ("AMD EPYC", "Intel(R) Xeon(R)") if v in measured_on)  # the CPU it was measured on
        assert f"on an {vendor.replace('(R)', '')} with {cpu_words}" in bullet, (measured_on, bullet)
        assert cpu_words in bullet and (flag in measured_on) is present, (measured_on, bullet)
    convert = bench["convert_time"]
    assert f"({convert['toolkit_s']:.0f} s vs {convert['plain_s']:.0f} s)" in " ".join(_section("Measured").split())
