"""``edgetk --help`` and deploy-only use must not import numpy or the heavy frameworks (the front door stays
about as fast as importing click: scripts/bench startup measures the ratio, docs/benchmarks.md holds it)."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from tests.fixtures.cli import run_edgetk

pytestmark = pytest.mark.fast

HEAVY = ("numpy", "tensorflow", "torch", "onnx", "onnxruntime", "paramiko", "keras", "ai_edge_litert", "pydantic",
         "sqlalchemy", "matplotlib", "yaml")
# What `edgetk --help` may load of the toolkit itself: the package, the CLI modules, the exception tree and the
# option tables. Anything else (toolkit.types, targets, api, devices...) belongs inside a command's body.
LIGHT_TOOLKIT = {"toolkit", "toolkit.__about__", "toolkit.errors", "toolkit.options"}


def _modules_after(argv: list[str]) -> list[str]:
    code = (
        "import sys, json\n"
        "from toolkit.cli import cli\n"
        "try:\n"
        f"    cli.main({argv!r}, standalone_mode=False)\n"
        "except SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["convert", "--help"], ["deploy", "--help"], ["devices", "--help"]],
                         ids=lambda a: " ".join(a))
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    loaded = _modules_after(argv)
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert heavy == [], heavy
    if argv == ["--help"]:
        ours = {m for m in loaded if m == "toolkit" or m.startswith("toolkit.")}
        extra = sorted(m for m in ours - LIGHT_TOOLKIT if not m.startswith("toolkit.cli"))
        assert extra == [], f"edgetk --help imports {extra}: import them inside the command that needs them"


def test_version() -> None:
    from toolkit import __version__

    result = run_edgetk("--version")
    assert result.code == 0 and __version__ in result.stdout


def _listed(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under a group, e.g. ("devices", "probe")."""
    out = []
    for name, command in group.commands.items():
        out.append((*prefix, name))
        if isinstance(command, click.Group):
            out += _listed(command, (*prefix, name))
    return out


def test_every_command_is_listed() -> None:
    from toolkit.cli import COMMANDS, cli

    assert sorted(cli.commands) == sorted(attribute for _, attribute in COMMANDS)
    top = run_edgetk("--help")
    assert top.code == 0
    listed = {line.split()[0] for line in top.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == set(cli.commands)
    for group_name, group in cli.commands.items():
        if isinstance(group, click.Group):  # subcommands appear in their group's help
            sub = run_edgetk(group_name, "--help")
            listed = {line.split()[0] for line in sub.stdout.split("Commands:")[1].splitlines() if line.strip()}
            assert listed == set(group.commands), group_name
    assert ("devices", "setup") in _listed(cli) and ("targets", "show") in _listed(cli)
