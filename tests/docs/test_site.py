"""The documentation site (mkdocs.yml) is checked like code: it builds in strict mode (a broken link or a missing
page fails), its CLI reference holds every command and option click knows, its troubleshooting page every error
kind of the exception tree, and its pages render in the headless Chromium the suite already uses.

The site is built once per session (``site``, about 5 s); the tests read the built HTML. The commands shown in
the README and the task guides are run in tests/docs/test_commands.py.
"""

from __future__ import annotations

import html
import json
import importlib
import logging
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from tests.fixtures.chromium import chromium, needs_chromium
from toolkit.cli import cli
from toolkit.errors import ToolkitError

REPO = Path(__file__).resolve().parents[2]


def _mkdocs_missing() -> str | None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocs_click"):
        try:
            importlib.import_module(module)
        except ImportError:
            return module
    return None


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``scripts/docs build`` into a temporary folder: the build must pass in strict mode, with no warning."""
    missing = _mkdocs_missing()
    assert missing is None, f"{missing} is not installed: pip install -e '.[docs]' (scripts/test installs it)"
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([str(REPO / "scripts" / "docs"), "build", "--site-dir", str(out)], cwd=REPO,
                            env={**_env(), "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "WARNING" not in result.stderr, result.stderr[-4000:]
    return out


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("EDGETK_")}


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


# ------------------------------------------------------------------------------------------ strict build


def test_a_broken_link_or_a_missing_page_fails_the_build(tmp_path: Path) -> None:
    """The same configuration on a copy of docs/ with a link to a page that does not exist and a nav entry for
    another: a strict build aborts and names both (what `scripts/docs build` does with them). The two generated
    references are left out of this build (stub pages, their plugins off: they cost most of a build's time and
    are not what is tested here)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort
    from mkdocs.utils.yaml import yaml_load

    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    for stub in ("reference/cli.md", "reference/api.md"):
        (docs / stub).write_text("# A stub\n")
    guide = docs / "guides" / "convert.md"
    guide.write_text(guide.read_text() + "\nSee [the old page](no-such-page.md).\n")
    with (REPO / "mkdocs.yml").open() as handle:
        extensions = [e for e in yaml_load(handle)["markdown_extensions"] if e != "mkdocs-click"]
    config = load_config(str(REPO / "mkdocs.yml"), docs_dir=str(docs), site_dir=str(tmp_path / "site"),
                         plugins=["search"], markdown_extensions=extensions)
    config.nav.append({"Gone": "gone.md"})
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    handler = Collect()
    logging.getLogger("mkdocs").addHandler(handler)
    try:
        with pytest.raises(Abort):
            build(config)
    finally:
        logging.getLogger("mkdocs").removeHandler(handler)
    assert any("no-such-page.md" in w for w in warnings), warnings
    assert any("gone.md" in w for w in warnings), warnings


def test_every_page_of_the_nav_is_built(site: Path) -> None:
    from mkdocs.config import load_config

    def pages(nav: object) -> Iterator[str]:
        if isinstance(nav, str):
            yield nav
        elif isinstance(nav, dict):
            for value in nav.values():
                yield from pages(value)
        elif isinstance(nav, list):
            for item in nav:
                yield from pages(item)

    names = list(pages(load_config(str(REPO / "mkdocs.yml"))["nav"]))
    assert {"index.md", "troubleshooting.md", "reference/cli.md", "reference/api.md", "benchmarks.md"} <= set(names)
    for name in names:
        folder = name.removesuffix(".md")
        folder = folder.removesuffix("index") if folder == "index" or folder.endswith("/index") else folder
        assert (site / folder / "index.html").is_file(), name


# ------------------------------------------------------------------------------------------ CLI reference


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def _sections(page: str) -> dict[str, str]:
    """heading id -> the text of the section under it (up to the next heading)."""
    parts = re.split(r'<h[1-6] id="([^"]+)"', page)
    return {parts[i]: _text(parts[i + 1]) for i in range(1, len(parts) - 1, 2)}


def missing_from_reference(page: str, root: click.Group) -> list[str]:
    """What click knows that the reference page lacks: a command's section, an option (every spelling), an
    argument in the usage line. Hidden options are not shown by --help either."""
    sections = _sections(page)
    missing = []
    for path, command in [((), root), *_commands(root)]:
        anchor = "-".join(("edgetk", *path))
        text = sections.get(anchor)
        if text is None:
            missing.append(f"edgetk {' '.join(path)}: no section")
            continue
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                for opt in (*param.opts, *param.secondary_opts):
                    if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text):
                        missing.append(f"edgetk {' '.join(path)} {opt}")
            elif isinstance(param, click.Argument) and param.human_readable_name not in text:
                missing.append(f"edgetk {' '.join(path)} {param.human_readable_name}")
    return missing


def test_the_cli_reference_has_every_command_and_option(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    assert missing_from_reference(page, cli) == []
    assert len(list(_commands(cli))) >= 20  # the walk itself reached the lazily loaded commands


def test_the_api_reference_documents_every_public_name(site: Path) -> None:
    import toolkit.api

    page = (site / "reference" / "api" / "index.html").read_text()
    for name in toolkit.api.__all__:
        assert f'id="toolkit.api.{name}"' in page, name
    assert 'id="toolkit.errors.DeviceError"' in page


# ------------------------------------------------------------------------------------------ troubleshooting


# Not imported: the device side runs on the device, never through the CLI; alembic's migration scripts run
# only inside alembic (importing them elsewhere fails); __main__ modules run the CLI.
NOT_IMPORTED = ("toolkit.device_side", "toolkit.store.migrations")


def _error_tree() -> set[type[ToolkitError]]:
    """Every subclass of ToolkitError, after importing every module of toolkit/: the tree as Python sees it,
    independent of the page generator's reading of the source."""
    import toolkit

    for module in pkgutil.walk_packages(toolkit.__path__, "toolkit."):
        if not module.name.startswith(NOT_IMPORTED) and not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found: set[type[ToolkitError]] = set()
    todo: list[type[ToolkitError]] = [ToolkitError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(c for c in cls.__subclasses__() if c not in found)
    return found


def test_troubleshooting_lists_every_error_kind_with_its_exit_code_and_fix(site: Path) -> None:
    page = (site / "troubleshooting" / "index.html").read_text()
    sections = _sections(page)
    tree = _error_tree()
    assert len(tree) >= 20
    for cls in tree:
        text = sections.get(cls.__name__.lower())
        assert text is not None, f"{cls.__module__}.{cls.__name__} is not on the troubleshooting page"
        assert f"Exit code {cls.exit_code}." in text, (cls.__name__, text[:300])
        assert " ".join(cls.fix.replace("`", "").split()) in " ".join(text.split()), (cls.__name__, cls.fix)
        assert cls.__module__ in text
    table = _text(page.split("<table>", 1)[1].split("</table>", 1)[0])
    assert all(cls.__name__ in table for cls in tree)


# ------------------------------------------------------------------------------------------ rendering


@needs_chromium
@pytest.mark.parametrize(("page", "heading", "needle"), [
    ("index.html", "edge-toolkit", "Two commands"),
    ("guides/convert/index.html", "Convert your model", "edgetk convert model.keras"),
])
def test_pages_render_in_headlesschromium(site: Path, tmp_path: Path, page: str, heading: str,
                                           needle: str) -> None:
    import numpy as np
    from PIL import Image

    url = (site / page).as_uri()
    dom = chromium(["--dump-dom", url], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    h1 = re.search(r"<h1[^>]*>(.*?)</h1>", dom.stdout, re.S)
    assert h1 and heading in _text(h1.group(1)), dom.stdout[:2000]
    assert needle in _text(dom.stdout)
    assert 'class="md-nav' in dom.stdout  # the theme's navigation was rendered around the page

    shot = tmp_path / "page.png"
    result = chromium([f"--screenshot={shot}", "--window-size=1280,1000", "--hide-scrollbars", url], tmp_path)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert pixels.shape == (1000, 1280)
    assert pixels.std() > 20, pixels.std()  # text, header bar and navigation, not a blank page
    assert (pixels < 100).mean() > 0.01  # dark pixels: rendered text and the header


# ------------------------------------------------------------------------------------------ benchmarks


def test_the_benchmarks_page_shows_the_figures_of_benchmarks_json(site: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import docs_hooks
    finally:
        sys.path.remove(str(REPO / "scripts"))
    from benchmarks.__main__ import summary

    headlines = json.loads((REPO / "docs" / "benchmarks.json").read_text())
    rows = [[_text(c).replace("`", "").strip() for c in line.strip("|").split("|")]
            for line in summary(headlines).splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 10
    page = " ".join(_text((site / "benchmarks" / "index.html").read_text()).split())
    for what, measured, _ in rows:
        assert f"{what} {measured}" in page, (what, measured)

    # the table comes from the JSON, not from the Markdown's copy of it
    headlines["convert_time"]["ratio"] = 9.87
    edited = tmp_path / "benchmarks.json"
    edited.write_text(json.dumps(headlines))
    markdown = docs_hooks.benchmarks_markdown((REPO / "docs" / "benchmarks.md").read_text(), edited)
    assert "9.87x" in markdown and "9.87x" not in (REPO / "docs" / "benchmarks.md").read_text()
