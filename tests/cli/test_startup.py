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
# What `edgetk --help` may load of the toolkit itself: the package, the CLI group and the exception tree; the
# command modules load only when their command runs or shows its own help. A command module in turn keeps
# toolkit.model, targets, api, devices... inside the command's body.
LIGHT_TOOLKIT = {"toolkit", "toolkit.__about__", "toolkit.errors", "toolkit.cli", "toolkit.cli._output"}


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
    if argv == ["--help"]:  # a command's own --help may load its vocabularies (the choices it lists)
        ours = {m for m in loaded if m == "toolkit" or m.startswith("toolkit.")}
        assert ours == LIGHT_TOOLKIT, f"edgetk --help imports {sorted(ours - LIGHT_TOOLKIT)}"


def test_version() -> None:
    from toolkit import __version__

    result = run_edgetk("--version")
    assert result.code == 0 and __version__ in result.stdout


def test_every_command_is_listed_with_its_own_summary() -> None:
    from toolkit.cli import COMMANDS, cli

    ctx = click.Context(cli)
    names = cli.list_commands(ctx)
    assert names == sorted(name for _, name, _ in COMMANDS)
    for module, name, summary in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name, (module, name)
        # the table's summary is the command's own first sentence (so `edgetk --help` needs no import)
        assert summary == command.get_short_help_str(10_000), name
    top = run_edgetk("--help")
    assert top.code == 0
    listed = [line.split()[0] for line in top.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == names
    for name in names:
        group = cli.get_command(ctx, name)
        if isinstance(group, click.Group):  # subcommands appear in their group's help
            sub = run_edgetk(name, "--help")
            listed = [line.split()[0] for line in sub.stdout.split("Commands:")[1].splitlines() if line.strip()]
            assert listed == sorted(group.commands), name
