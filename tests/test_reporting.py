"""Reports: the terminal table (colour only on a terminal), and ``edgetk report --html`` rendered in real
headless Chromium (Debian's ``chromium``; scripts/test installs it): the plots are there as decodable PNGs,
the tables hold the bundle's artifacts and the stored checks, and the page renders (``--dump-dom`` and a
screenshot that is not blank)."""

from __future__ import annotations

import base64
import io
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.fixtures.chromium import chromium, needs_chromium
from tests.fixtures.cli import assert_clean_error, run_edgetk, run_edgetk_inproc



class _Page(HTMLParser):
    """Collects img tags, tables (id -> rows of cell text) and headings."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.headings: list[str] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._heading = False

    def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
        a = {k: v or "" for k, v in attrs}
        if tag == "img":
            self.images.append(a)
        elif tag == "table":
            self._table = a.get("id", f"table{len(self.tables)}")
            self.tables[self._table] = []
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag in ("h1", "h2"):
            self._heading = True
            self.headings.append("")

    def handle_endtag(self, tag):  # type: ignore[no-untyped-def]
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag in ("h1", "h2"):
            self._heading = False

    def handle_data(self, data):  # type: ignore[no-untyped-def]
        if self._cell is not None:
            self._cell.append(data)
        if self._heading:
            self.headings[-1] += data


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def _decode_png(src: str):  # type: ignore[no-untyped-def]
    from PIL import Image

    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    image = Image.open(io.BytesIO(base64.b64decode(src[len(prefix):], validate=True)))
    image.load()
    return image


def test_terminal_table_colour_only_when_asked(checked_bundle):  # type: ignore[no-untyped-def]
    from toolkit.reporting.terminal import bundle_table

    reports = checked_bundle.result.devices[0].reports
    plain = bundle_table(checked_bundle.result.manifest, reports, colour=False)
    coloured = bundle_table(checked_bundle.result.manifest, reports, colour=True)
    assert "\x1b[" not in plain and "\x1b[32m" in coloured  # green PASS
    import click

    assert click.unstyle(coloured) == plain  # colour never changes the layout
    rows = [line for line in plain.splitlines() if line.startswith("model.")]
    assert [r.split()[0] for r in rows] == ["model.fp32.tflite", "model.int8.tflite"]
    assert all(r.endswith("PASS") for r in rows)
    assert "here" in rows[0] and "MB" in rows[0]


@needs_chromium
def test_bundle_html_report_renders_with_plots_and_tables(checked_bundle, tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "report.html"
    result = run_edgetk("report", checked_bundle.bundle, "--html", out, "--store", checked_bundle.store)
    assert result.code == 0, result.stderr
    assert "PASS" in result.stdout and "\x1b[" not in result.stdout
    text = out.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text  # self-contained
    page = _parse(text)
    ids = {img.get("id") for img in page.images}
    assert ids == {"plot-latency", "plot-tradeoff", "plot-trend"}
    for img in page.images:
        image = _decode_png(img["src"])
        assert image.width > 400 and image.height > 250, img["id"]
        assert len(set(image.convert("L").getdata())) > 20, img["id"]  # a drawing, not a flat rectangle
    artifacts = page.tables["artifacts"]
    assert artifacts[0][:3] == ["artifact", "precision", "size"]
    assert [row[0] for row in artifacts[1:]] == ["model.fp32.tflite", "model.int8.tflite"]
    assert all(row[5] == "here" and row[-1] == "PASS" for row in artifacts[1:])
    history = page.tables["history"]
    assert len(history) - 1 == 4  # two checks of two artifacts
    assert {row[2] for row in history[1:]} == {"here"}
    assert any("Manifest" in h for h in page.headings)

    dom = chromium(["--dump-dom", out.as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = _parse(dom.stdout)
    assert {img.get("id") for img in rendered.images} == ids
    assert [row[0] for row in rendered.tables["artifacts"][1:]] == ["model.fp32.tflite", "model.int8.tflite"]

    shot = tmp_path / "report.png"
    taken = chromium([f"--screenshot={shot}", "--window-size=1280,2000", out.as_uri()], tmp_path)
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    from PIL import Image

    image = Image.open(shot)
    assert image.size == (1280, 2000)
    colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200  # text, tables and plots, not a blank page


@needs_chromium
def test_history_html_and_json(checked_bundle, tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "history.html"
    result = run_edgetk("report", "--history", "--html", out, "--store", checked_bundle.store)
    assert result.code == 0, result.stderr
    assert "digits-api" in result.stdout
    page = _parse(out.read_text())
    assert [img.get("id") for img in page.images] == ["plot-trend"]
    _decode_png(page.images[0]["src"])
    assert len(page.tables["history"]) - 1 == 4 and len(page.tables["trends"]) - 1 == 2
    dom = chromium(["--dump-dom", out.as_uri()], tmp_path)
    assert dom.returncode == 0 and 'id="plot-trend"' in dom.stdout

    doc = run_edgetk("report", checked_bundle.bundle, "--store", checked_bundle.store, "--json").json()
    assert set(doc) == {"bundle", "version", "store", "manifest", "latest", "history", "trends", "selected"}
    assert len(doc["latest"]) == 2 and len(doc["history"]) == 4
    files = {a["file"] for a in doc["manifest"]["artifacts"]}
    assert doc["selected"] and all(s["artifact"] in files and s["version"] == doc["version"] for s in doc["selected"])
    assert {r["run_id"] for r in doc["latest"]} == {doc["history"][-1]["run_id"]}  # the newest run only


def test_report_usage_errors(checked_bundle, tmp_path):  # type: ignore[no-untyped-def]
    assert_clean_error(run_edgetk_inproc("report"), 2, "either a bundle directory or --history")
    assert_clean_error(run_edgetk_inproc("report", checked_bundle.bundle, "--history"), 2, "either")
    assert_clean_error(run_edgetk_inproc("report", tmp_path), 2, "not a bundle directory")
    empty = run_edgetk_inproc("report", checked_bundle.bundle, "--store", tmp_path / "empty.sqlite")
    assert empty.code == 0 and "no stored check" in empty.stdout


def test_html_report_shows_placement_operators_throughput_and_loads(checked_bundle, tmp_path):  # type: ignore[no-untyped-def]
    """A real check with --profile --throughput --loads on the device env, then the report of that history (a
    copy of the session's store, so the other tests' counts stay as they are)."""
    from toolkit import api
    from toolkit.reporting.terminal import inside_lines
    from tests.fixtures.home import home_scope
    from tests.fixtures.runs import NO_GATES

    store = tmp_path / "history.sqlite"
    shutil.copy(checked_bundle.store, store)
    with home_scope(checked_bundle.home):
        fleet = api.check(checked_bundle.bundle, devices=[checked_bundle.device], runs=10, store=store,
                          profile=True, throughput=True, loads=True, **NO_GATES)
    reports = [r.to_dict() for d in fleet.devices for r in d.reports]
    assert {r["artifact"] for r in reports} == {"model.fp32.tflite", "model.int8.tflite"}
    for report in reports:
        assert report["profile"] and report["throughput"] and report["loads"] and report["placement"]
        lines = "\n".join(inside_lines(report))
        assert "placement:" in lines and "throughput:" in lines and "loads: cold" in lines
    out = tmp_path / "report.html"
    result = run_edgetk("report", checked_bundle.bundle, "--html", out, "--store", store)
    assert result.code == 0, result.stderr
    page = _parse(out.read_text())
    ids = {img.get("id") for img in page.images}
    assert {"plot-operators", "plot-throughput"} <= ids, ids
    for img in page.images:
        image = _decode_png(img["src"])
        assert len(set(image.convert("L").getdata())) > 20, img["id"]
    placement = page.tables["placement"]
    assert placement[0][:3] == ["artifact", "device", "intended"]
    assert {row[0] for row in placement[1:]} == {"model.fp32.tflite", "model.int8.tflite"}
    assert all(row[2] == "XNNPACK" for row in placement[1:])
    loads = page.tables["loads"]
    assert {row[0] for row in loads[1:]} == {"model.fp32.tflite", "model.int8.tflite"}
    assert {row[4] for row in loads[1:]} == {"xnnpack_weight_cache"}
    assert any("Operators" in h for h in page.headings) and any("Throughput" in h for h in page.headings)
