"""``edgetk --help`` against ``python -c "import click"``: what the front door costs beyond the library it is
built on (issue 12's target: at most 2x). Both run as fresh processes of the same interpreter, interleaved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, interleaved, log, machine, table

TITLE = "Startup: `edgetk --help` vs `import click` (issue 12)"
TARGET = 2.0


def _process(*argv: str) -> Any:
    def call() -> None:
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=REPO)

    return call


def run() -> tuple[str, dict[str, Any]]:
    edgetk = Path(sys.executable).with_name("edgetk")
    help_cmd = [str(edgetk), "--help"] if edgetk.exists() else [sys.executable, "-m", "toolkit.cli", "--help"]
    variants = {
        "python -c pass": _process(sys.executable, "-c", "pass"),
        "python -c 'import click'": _process(sys.executable, "-c", "import click"),
        "edgetk --help": _process(*help_cmd),
        "edgetk deploy --help": _process(*help_cmd[:-1], "deploy", "--help"),
    }
    log("timing fresh processes, interleaved")
    load_before = os.getloadavg()[0]
    timed = interleaved(variants, rounds=10, per_round=5, warmup=1)
    load_after = os.getloadavg()[0]
    click_ms = timed["python -c 'import click'"].median
    rows = [[name, f"{t.median:.1f}", f"{t.median / click_ms:.2f}x", t.runs] for name, t in timed.items()]
    ratio = timed["edgetk --help"].median / click_ms
    markdown = (
        f"## {TITLE}\n\n"
        "Wall time of a fresh process, median of interleaved runs (10 rounds of 5). `edgetk --help` loads click, "
        "the CLI group and the exception tree, no command module (each loads when its command runs or shows its "
        "own help; `deploy --help` loads its module and the option tables); no help loads numpy or a framework "
        "(tests/cli/test_startup.py holds both). "
        f"Target: `edgetk --help` at most {TARGET:g}x `import click`.\n\n"
        + table(["process", "median ms", "x import click", "runs"], rows)
        + f"\n\n`edgetk --help` = **{ratio:.2f}x** `python -c 'import click'`. Measured on "
        f"{machine().get('CPU', 'this machine')} ({os.cpu_count()} cores) with a 1-minute load average of {load_before:.1f} before and "
        f"{load_after:.1f} after (a shared machine: the absolute times scale with the load, the ratio much less)."
    )
    return markdown, {"help_vs_click": ratio, "help_ms": timed["edgetk --help"].median, "click_ms": click_ms}
