"""``edgetk``: the command line. The one place that turns a ToolkitError into a message and an exit code.

Each command lives in its own module under ``toolkit.cli`` and imports heavy frameworks only inside its body,
so ``edgetk --help`` and deploy-only use never load tensorflow, torch, onnx, onnxruntime or paramiko.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback
import warnings
from typing import Any

import click

from toolkit.__about__ import __version__
from toolkit.errors import ToolkitError

# (module under toolkit.cli, attribute): each attribute is a click command or group added to `edgetk`.
_COMMANDS: tuple[tuple[str, str], ...] = (
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
    ("run_cmd", "run"),
    ("run_cmd", "quickstart"),
    ("report_cmd", "report"),
    ("optimize_cmd", "optimize"),
)


class _Group(click.Group):
    """Adds the commands whose modules exist; turns ToolkitError into one plain message and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ToolkitError as exc:
            debug = bool(ctx.obj and ctx.obj.get("debug"))
            if debug:
                traceback.print_exc()
            click.secho(f"error: {exc.message}", err=True, fg="red")
            if exc.hint:
                click.echo(f"  {exc.hint}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="edgetk")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """edge-toolkit: convert a model, deploy it to your devices over SSH, and check it there."""
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
    for module_name, attribute in _COMMANDS:
        module = importlib.import_module(f"toolkit.cli.{module_name}")
        cli.add_command(getattr(module, attribute))


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="edgetk", standalone_mode=True)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
