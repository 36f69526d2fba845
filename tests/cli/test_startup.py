"""``edgetk --help`` and deploy-only use must not import the heavy frameworks."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.fixtures.cli import run_edgetk

HEAVY = ("tensorflow", "torch", "onnx", "onnxruntime", "paramiko", "keras", "ai_edge_litert", "pydantic")


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys, json\n"
        "from toolkit.cli import cli\n"
        "try:\n    cli.main(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_version() -> None:
    from toolkit import __version__

    result = run_edgetk("--version")
    assert result.code == 0 and __version__ in result.stdout


def test_every_command_is_listed() -> None:
    result = run_edgetk("--help")
    for command in ("convert", "inspect", "targets"):
        assert command in result.stdout
