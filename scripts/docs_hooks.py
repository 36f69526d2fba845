"""MkDocs hooks of the documentation site (mkdocs.yml): pages generated from the code when the site is built,
so that no fact is written twice.

``index.md`` (the home page) is README.md, its links into ``docs/`` made relative to the site.

``benchmarks.md``'s headline table is rendered from docs/benchmarks.json by the function ``scripts/bench``
writes it with (``benchmarks.__main__.summary``), so the page shows what the JSON holds even where the Markdown
was edited by hand.

``troubleshooting.md`` lists every error kind edgetk can print, from the one exception tree
(``toolkit/errors.py`` and its subclasses elsewhere in ``toolkit/``): its exit code, what it means (the class
docstring) and what to do (the class's ``fix``, else its nearest ancestor's). The tree is read from the source
with ``ast``, not by importing every module, so that building the site never needs TensorFlow or torch;
tests/docs/test_site.py checks the page against the imported tree.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ROOT_CLASS = "ToolkitError"
TROUBLESHOOTING = "troubleshooting.md"
HOME = "index.md"
INTRO = """# Troubleshooting

Every error edgetk reports is one of the kinds below, generated from the exception tree in
`toolkit/errors.py` when this site is built. The CLI prints `error: MESSAGE` and a hint on stderr and exits
with the kind's code; with `--json` the same error is the command's one JSON document, whose `error.kind` is
the name in the first column ([the error document](schemas/error.md), which also covers click's own kinds for
a bad flag, exit 2, and `InternalError`, a bug). `--debug` adds the traceback. With several devices the worst
code wins, and a device that fails inside a fleet command is reported under its device with the same message.

Exit codes: 0 ok, 1 a check or gate failed, 2 bad usage, configuration or input, 3 conversion failed, 4 a
device could not be reached, refused us, or could not take the bundle.

A failed gate (exit 1) is a verdict, not an error kind: read which gate failed in the table or the --json
document (budget, outputs, accuracy, regression, placement); `edgetk report BUNDLE --html report.html` shows the
measurements. Then change what was measured (another precision, format, target or model), or the gate itself on
purpose (--budget-ms, --baseline none, the profile's tolerance).
"""


@dataclass(frozen=True)
class ErrorKind:
    """One class of the exception tree, as its source defines it (``None``: inherited from the parent)."""

    name: str
    module: str
    parent: str | None  # the base it is listed under (the first base inside the tree)
    exit_code: int | None
    fix: str | None
    doc: str


@dataclass(frozen=True)
class _Class:
    name: str
    module: str
    bases: tuple[str, ...]
    exit_code: int | None
    fix: str | None
    doc: str


def _constant(node: ast.ClassDef, name: str) -> Any:
    """The literal value a class body assigns to ``name`` (``x = ...`` or ``x: T = ...``), else None."""
    for statement in node.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            try:
                return ast.literal_eval(value)
            except ValueError:
                return None
    return None


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _classes(root: Path) -> dict[str, _Class]:
    found: dict[str, _Class] = {}
    for path in sorted(root.rglob("*.py")):
        if "device_side" in path.parts:  # runs on the device, never prints through the CLI
            continue
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, _Class(
                    node.name, module, tuple(b for b in map(_base_name, node.bases) if b),
                    _constant(node, "exit_code"), _constant(node, "fix"),
                    inspect.cleandoc(ast.get_docstring(node) or "")))
    return found


def error_kinds(root: Path = REPO / "toolkit") -> list[ErrorKind]:
    """Every class under ``ToolkitError`` defined in ``root``, depth first (``toolkit/errors.py``'s own
    classes before those defined elsewhere), each with its exit code and fix resolved through its
    ancestors."""
    classes = _classes(root)
    children: dict[str, list[_Class]] = {}
    for cls in sorted(classes.values(), key=lambda c: c.module != "toolkit.errors"):
        for base in cls.bases:
            children.setdefault(base, []).append(cls)
    order: list[ErrorKind] = []

    def visit(cls: _Class, parent: ErrorKind | None) -> None:
        if any(kind.name == cls.name for kind in order):  # a second base inside the tree: listed once
            return
        kind = ErrorKind(cls.name, cls.module, parent.name if parent else None,
                         cls.exit_code if cls.exit_code is not None else parent.exit_code if parent else None,
                         cls.fix if cls.fix is not None else parent.fix if parent else None,
                         cls.doc)
        order.append(kind)
        for child in children.get(cls.name, []):
            visit(child, kind)

    visit(classes[ROOT_CLASS], None)
    return order


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def troubleshooting_markdown(kinds: list[ErrorKind] | None = None) -> str:
    """The troubleshooting page: a table of every error kind, then one section each."""
    kinds = error_kinds() if kinds is None else kinds
    lines = [INTRO, "| error kind | a kind of | exit code | what to do |", "|---|---|---|---|"]
    for kind in kinds:
        parent = f"`{kind.parent}`" if kind.parent else ""
        anchor = f"[`{kind.name}`](#{kind.name.lower()})"
        lines.append(f"| {anchor} | {parent} | {kind.exit_code} | {_one_line(kind.fix)} |")
    for kind in kinds:
        where = f"Raised from `{kind.module}`" + (f"; a kind of [`{kind.parent}`](#{kind.parent.lower()})."
                                                 if kind.parent else ".")
        lines += ["", f"## {kind.name}", "", f"Exit code **{kind.exit_code}**. {where}", "",
                  kind.doc, "", f"**What to do:** {_one_line(kind.fix)}"]
    return "\n".join(lines) + "\n"


def home_markdown(readme: Path = REPO / "README.md") -> str:
    """README.md as the site's home page: a link to ``docs/X`` becomes ``X``. Any other relative link would
    leave the site, so the README links only into docs/ (a strict build fails otherwise)."""
    return readme.read_text().replace("](docs/", "](")


def benchmarks_markdown(markdown: str, headlines: Path = REPO / "docs" / "benchmarks.json") -> str:
    """``markdown`` (docs/benchmarks.md) with its ``bench:summary`` block rendered from ``headlines``."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from benchmarks.__main__ import summary

    block = re.compile(r"(<!-- bench:summary -->\n).*?(\n<!-- /bench:summary -->)", re.S)
    if not block.search(markdown):
        raise ValueError("docs/benchmarks.md has no <!-- bench:summary --> block (scripts/bench writes one)")
    table = summary(json.loads(headlines.read_text())).strip()
    return block.sub(lambda match: match.group(1) + table + match.group(2), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The benchmarks page's headline table from docs/benchmarks.json."""
    return benchmarks_markdown(markdown) if page.file.src_uri == "benchmarks.md" else markdown


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site (``File.generated``: mkdocs >= 1.6)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, HOME, content=home_markdown()))
    files.append(File.generated(config, TROUBLESHOOTING, content=troubleshooting_markdown()))
    return files
