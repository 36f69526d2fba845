"""How a command hands its result to the user: one JSON document on stdout (``--json``) or text, and the exit
code. The group's error handler (``toolkit.cli``) uses :func:`emit` too, so a failing ``--json`` command still
prints exactly one document."""

from __future__ import annotations

import sys

import click

EMITTED = "edgetk.emitted"  # ctx.meta key: a JSON document is already on stdout
WANTS_JSON = "edgetk.json"  # ctx.meta key: --json was given


def emit(document: object) -> None:
    """Print ``document`` as the command's one JSON document on stdout."""
    import json

    click.echo(json.dumps(document, indent=2))
    sys.stdout.flush()
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[EMITTED] = True


def error_document(kind: str, message: str, hint: str | None, exit_code: int) -> dict[str, object]:
    """The ``--json`` document of a command that failed before it had a result (docs/schemas/error.md)."""
    return {"passed": False, "exit_code": exit_code, "error": {"kind": kind, "message": message, "hint": hint}}


def done(exit_code: int) -> None:
    """End the command with the contract's exit code (0: return normally)."""
    if exit_code:
        raise SystemExit(exit_code)
