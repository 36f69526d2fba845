"""``edgetk``: the command line. The one place that turns a ToolkitError into a message and an exit code.

Each command lives in its own module under ``toolkit.cli``: it parses its flags, calls ONE ``toolkit.api``
function and renders the result (``result.to_dict()`` is its ``--json`` document). Command modules import
nothing heavy at module level (no numpy, no framework, no ``toolkit.model``), so ``edgetk --help`` stays
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
from typing import Any  # Any: what click's invoke returns

import click

from toolkit.__about__ import __version__
from toolkit.cli._output import EMITTED, WANTS_JSON, emit, error_document
from toolkit.errors import ToolkitError

# (module under toolkit.cli, command name = the module's attribute, the one-line summary `edgetk --help` shows).
# Command modules load only when their command runs or shows its own help, so `edgetk --help` imports none of
# them; tests/cli/test_startup.py checks that each summary is the command's own (its docstring's first sentence).
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("convert_cmd", "convert", "Convert SOURCE (Keras, SavedModel, ONNX, TFLite, PyTorch) into a verified bundle."),
    ("inspect_cmd", "inspect", "Inputs, outputs, quantization, operator counts and size of a .tflite, .onnx or "
                               "bundle."),
    ("targets_cmd", "targets", "Device profiles: what each target runs best (recipes, runtimes, budget, tolerance)."),
    ("deploy_cmd", "deploy", "Push BUNDLE to devices, verify every file there, and make it current (keeps the last 3 "
                             "versions)."),
    ("deploy_cmd", "check", "Run the deployed BUNDLE on devices: latency, memory, outputs; gate on budget and "
                            "regression."),
    ("deploy_cmd", "rollback", "Switch bundle NAME back to its previous installed version (verified first)."),
    ("deploy_cmd", "status", "Which bundles and versions are installed on each device, and which version is current."),
    ("deploy_cmd", "remove", "Delete bundle NAME (every version) from devices."),
    ("prune_cmd", "prune", "Remove old versions of bundle NAME from devices, never the current one or the one a "
                           "rollback returns to."),
    ("devices_cmd", "devices", "Inspect devices and set up their runtimes."),
    ("history_cmd", "history", "List stored checks (who ran them, where), and the p50 trend per device, bundle and "
                               "artifact."),
    ("export_cmd", "export", "Package BUNDLE for another delivery system: a Mender artifact (install the Update "
                             "Module written next to it on each device once, as /usr/share/mender/modules/v3/edgetk)."),
    ("run_cmd", "run", "Convert SOURCE, deploy the bundle to the devices and check it there, in one go."),
    ("run_cmd", "quickstart", "The whole job on this machine, nothing to bring: a small digits model, trained once "
                              "and cached, is converted for this machine's target profile, deployed to `local` and "
                              "checked there."),
    ("report_cmd", "report", "Tables and plots for a bundle (host and device measurements) or for the whole check "
                             "history."),
    ("optimize_cmd", "optimize", "Compress SOURCE (a Keras 3 file or a PyTorch model) and write it to --out in the "
                                 "same format."),
)
_MODULE = {name: module for module, name, _ in COMMANDS}
_SUMMARY = {name: summary for _, name, summary in COMMANDS}


def _shorten(text: str, limit: int) -> str:
    """``text`` cut at a word boundary to ``limit`` characters, with "..." when cut (as click shortens help)."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 3, 1)].rsplit(" ", 1)[0].rstrip(",;:") + "..."


class _Group(click.Group):
    """Loads each command's module on first use; turns ToolkitError into one plain message and its exit code,
    with ``--json`` also into one document."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_MODULE})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _MODULE:
            module = importlib.import_module(f"toolkit.cli.{_MODULE[cmd_name]}")
            self.add_command(getattr(module, cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from the summaries in COMMANDS, without importing a command module."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            summary = _SUMMARY.get(name)
            if summary is None:  # a command added with add_command, not in the table
                command = self.get_command(ctx, name)
                summary = command.get_short_help_str(limit) if command is not None else ""
            rows.append((name, _shorten(summary, limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="edgetk", standalone_mode=True)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
