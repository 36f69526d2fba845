"""``edgetk``: the command line. The one place that turns a ToolkitError into a message and an exit code.

Each command lives in its own module under ``toolkit.cli``: it parses its flags, calls ONE ``toolkit.api``
function and renders the result (``result.to_dict()`` is its ``--json`` document). Command modules import
nothing heavy at module level (no numpy, no framework, no ``toolkit.types``), so ``edgetk --help`` stays
about as fast as importing click (tests/cli/test_startup.py, scripts/bench startup).

Errors: a :class:`~toolkit.errors.ToolkitError` prints ``error: MESSAGE`` and its hint on stderr and exits
with its code; with ``--json`` the same error is also printed as the command's one JSON document on stdout
(``{"passed": false, "exit_code", "error": {"kind", "message", "hint"}}``), so stdout is never empty.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from toolkit.__about__ import __version__
from toolkit.cli._output import EMITTED, WANTS_JSON, emit, error_document
from toolkit.errors import ToolkitError

# (module under toolkit.cli, attribute): each attribute is a click command or group added to `edgetk`.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("convert_cmd", "convert"),
    ("inspect_cmd", "inspect"),
    ("targets_cmd", "targets"),
    ("deploy_cmd", "deploy"),
    ("deploy_cmd", "check"),
    ("deploy_cmd", "rollback"),
    ("deploy_cmd", "status"),
    ("deploy_cmd", "remove"),
    ("devices_cmd", "devices"),
    ("history_cmd", "history"),
    ("export_cmd", "export"),
    ("run_cmd", "run"),
    ("run_cmd", "quickstart"),
    ("report_cmd", "report"),
    ("optimize_cmd", "optimize"),
)


class _Group(click.Group):
    """Turns ToolkitError into one plain message and its exit code; with ``--json`` also into one document."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[WANTS_JSON] = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as exc:  # e.g. `edgetk --json convert ...`: a bad flag of the group itself
            self._document(ctx, type(exc).__name__, exc.format_message(), None, exc.exit_code)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ToolkitError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                import traceback

                traceback.print_exc()
            self._document(ctx, type(exc).__name__, exc.message, exc.hint, exc.exit_code)
            click.secho(f"error: {exc.message}", err=True, fg="red")
            if exc.hint:
                click.echo(f"  {exc.hint}", err=True)
            ctx.exit(exc.exit_code)
        except click.ClickException as exc:  # bad flags: click prints the usage message on stderr, exit 2
            self._document(ctx, type(exc).__name__, exc.format_message(), None, exc.exit_code)
            raise
        except (click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            self._document(ctx, "Interrupted", "interrupted", None, 130)
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except Exception as exc:  # a bug: still one document with --json; the traceback follows on stderr
            self._document(ctx, "InternalError", f"{type(exc).__name__}: {exc}", "Run again with --debug and "
                           "report it.", 1)
            raise

    @staticmethod
    def _document(ctx: click.Context, kind: str, message: str, hint: str | None, code: int) -> None:
        if ctx.meta.get(WANTS_JSON) and not ctx.meta.get(EMITTED):
            emit(error_document(kind, message, hint, code))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="edgetk")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """edge-toolkit: convert a model, deploy it to your devices over SSH, and check it there."""
    import logging
    import warnings

    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if debug:
        os.environ["EDGETK_DEBUG"] = "1"
    else:
        warnings.simplefilter("ignore")  # library deprecation chatter is not the user's business
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


def _register() -> None:
    for module_name, attribute in COMMANDS:
        module = importlib.import_module(f"toolkit.cli.{module_name}")
        cli.add_command(getattr(module, attribute))


_register()


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="edgetk", standalone_mode=True)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
