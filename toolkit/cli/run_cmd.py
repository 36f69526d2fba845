"""``edgetk run`` (convert -> deploy -> check -> report) and ``edgetk quickstart`` (the same on this machine with
the bundled example).

``run`` stops at the first stage that fails and exits with that stage's code (3 or 2 convert, 4 or 2 deploy,
1 or 4 check). The effective options are written to the bundle as ``run.toml``; ``edgetk run --config FILE``
(or a bundle directory) replays them, and flags given beside ``--config`` win. ``--json`` prints one document
(docs/schemas/run.md); progress goes to stderr, one line per step, prefixed with its stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any  # Any: click and run.toml values; the api result (lazy)

import click

from toolkit.cli._output import done, emit
from toolkit.cli.deploy_cmd import break_lock_option
from toolkit.cli.options import PathType, check_options, convert_options, device_options

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

# Options that are not part of a replayable run.
_NOT_RECORDED = {"as_json", "config", "break_lock"}  # --break-lock is for one stuck run, never replayed


def _flag_names(command: click.Command) -> dict[str, click.Parameter]:
    """{flag name without dashes: parameter}: the keys a run config may use."""
    names: dict[str, click.Parameter] = {}
    for param in command.params:
        if isinstance(param, click.Argument):
            names[param.name or ""] = param
            continue
        longs = [o for o in param.opts if o.startswith("--")]
        if longs:
            names[longs[0][2:]] = param
    return names


def _apply_config(ctx: click.Context, values: dict[str, Any], path: Path) -> None:
    """Fill ``values`` from the config file wherever the user gave no flag (flags win)."""
    from toolkit.errors import UsageError
    from toolkit.model.runconfig import read_run_config
    from toolkit.model.schemas.problems import did_you_mean

    assert ctx.command is not None
    flags = _flag_names(ctx.command)
    for key, raw in read_run_config(path).items():
        param = flags.get(key)
        if param is None or param.name in _NOT_RECORDED:
            raise UsageError(f"{path}: unknown run option {key!r}.",
                             hint=did_you_mean(key, list(flags), sentence=True).strip() or "Use the flag names of `edgetk run`.")
        name = param.name or key
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":
            continue
        if param.multiple and not isinstance(raw, list):
            raw = [raw]
        try:
            values[name] = param.type_cast_value(ctx, raw)
        except click.BadParameter as exc:
            raise UsageError(f"{path}: {key} = {raw!r}: {exc.message}") from None


def _record(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The effective options as run.toml keys (flag names); paths absolute; unset options left out."""
    from pathlib import Path

    assert ctx.command is not None
    out: dict[str, Any] = {}
    for flag, param in _flag_names(ctx.command).items():
        name = param.name or flag
        if name in _NOT_RECORDED:
            continue
        value = values.get(name)
        if value is None or value == () or value is False:
            continue
        if isinstance(param.type, click.Path):  # absolute, so the replay works from another folder
            value = [str(Path(v).resolve()) for v in value] if param.multiple else str(Path(value).resolve())
        elif name == "source" and Path(str(value)).exists():
            value = str(Path(str(value)).resolve())
        elif isinstance(value, tuple):
            value = list(value)
        out[flag] = value
    out["force"] = True  # a replay rebuilds the bundle the config came from
    return out


def _colour() -> bool:
    from toolkit.reporting.terminal import stdout_is_terminal

    return stdout_is_terminal()


def _finish(result: Any, as_json: bool, *, next_hint: bool = True) -> None:
    from toolkit.reporting.terminal import run_summary

    if as_json:
        emit(result.to_dict())
    else:
        click.echo(run_summary(result, colour=_colour()), color=_colour())
        if result.passed and next_hint:
            click.echo(f"next: edgetk report {result.bundle_dir} --html report.html", err=True)
    done(result.exit_code)


@click.command("run")
@click.argument("source", required=False)
@convert_options
@device_options
@check_options
@click.option("--force-deploy", is_flag=True,
              help="Deploy even if the bundle's target arch differs from the device's.")
@break_lock_option
@click.option("--config", "config", type=PathType(), default=None,
              help="Replay a run: a run.toml (or a bundle made by `edgetk run`); flags given beside it win.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (docs/schemas/run.md).")
@click.pass_context
def run(ctx: click.Context, /, **values: Any) -> None:
    """Convert SOURCE, deploy the bundle to the devices and check it there, in one go.

    Stops at the first stage that fails, with that stage's exit code. The options are kept in the bundle
    (run.toml) so `edgetk run --config BUNDLE/run.toml` does the same run again.
    """
    from toolkit import api
    from toolkit.errors import UsageError
    from toolkit.model.options import CheckOptions, ConvertOptions, DeviceOptions, keywords_from_params
    from toolkit.reporting.progress import StageProgress

    if values.get("config") is not None:
        _apply_config(ctx, values, values["config"])
    source = values.get("source")
    if not source:
        raise UsageError("No SOURCE given.", hint="Pass a model path, or --config FILE to replay a run.")
    progress = StageProgress()
    result = api.run(
        source, deploy_force=values["force_deploy"], break_lock=values["break_lock"], progress=progress, progress_stream=progress.stream("deploy"),
        config=_record(ctx, values), **keywords_from_params(values, ConvertOptions, DeviceOptions, CheckOptions),
    )
    _finish(result, values["as_json"])


@click.command("quickstart")
@click.option("--out", type=PathType(), default=None,
              help="Where to write the example bundle (default ./bundles/digits-<this machine's target>).")
@click.option("--runs", type=click.IntRange(1), default=30, show_default=True, help="Timed runs per artifact.")
@click.option("--store", default=None, metavar="PATH|URL",
              help="Check history file (default $EDGETK_STORE or ~/.local/share/edgetk/history.sqlite).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (as `edgetk run --json`).")
def quickstart(out: Any, runs: int, store: Any, as_json: bool) -> None:
    """The whole job on this machine, nothing to bring: a small digits model, trained once and cached, is
    converted for this machine's target profile, deployed to `local` and checked there."""
    from toolkit import api
    from toolkit.reporting.progress import StageProgress

    progress = StageProgress(stages=("convert", "deploy", "check"))
    result = api.quickstart(out=out, store=store, runs=runs, progress=progress,
                           progress_stream=progress.stream("deploy"))
    _finish(result, as_json, next_hint=False)
    if not as_json:
        click.echo(f"\ngo on with:\n  edgetk report {result.bundle_dir} --html report.html\n"
                   f"  edgetk inspect {result.bundle_dir}\n"
                   f"  edgetk deploy {result.bundle_dir} --device user@your-pi --check")
