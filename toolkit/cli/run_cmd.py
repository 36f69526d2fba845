"""``edgetk run`` (convert -> deploy -> check -> report) and ``edgetk quickstart`` (the same on this machine with
the bundled example).

``run`` stops at the first stage that fails and exits with that stage's code (3 or 2 convert, 4 or 2 deploy,
1 or 4 check). The effective options are written to the bundle as ``run.toml``; ``edgetk run --config FILE``
(or a bundle directory) replays them, and flags given beside ``--config`` win. ``--json`` prints one document
(docs/schemas/run.md); progress goes to stderr, one line per step, prefixed with its stage.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import click

from toolkit.cli._fleet import device_options
from toolkit.cli.deploy_cmd import _check_options
from toolkit.cli.options import convert_options

# Options that are not part of a replayable run.
_NOT_RECORDED = {"as_json", "config"}
# Path-valued options recorded as absolute paths so the replay works from another folder.
_PATHS = {"calibration", "eval_data", "labels", "weights", "out", "inventory", "known_hosts", "store"}


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
    from toolkit.runconfig import read_run_config

    assert ctx.command is not None
    flags = _flag_names(ctx.command)
    for key, raw in read_run_config(path).items():
        param = flags.get(key)
        if param is None or param.name in _NOT_RECORDED:
            close = difflib.get_close_matches(key, list(flags), n=1)
            raise UsageError(f"{path}: unknown run option {key!r}.",
                             hint=f"Did you mean {close[0]!r}?" if close else "Use the flag names of `edgetk run`.")
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
    assert ctx.command is not None
    out: dict[str, Any] = {}
    for flag, param in _flag_names(ctx.command).items():
        name = param.name or flag
        if name in _NOT_RECORDED:
            continue
        value = values.get(name)
        if value is None or value == () or value is False:
            continue
        if name in _PATHS:
            value = str(Path(value).resolve())
        elif name == "targets_dirs":
            value = [str(Path(v).resolve()) for v in value]
        elif name == "source" and Path(str(value)).exists():
            value = str(Path(str(value)).resolve())
        elif isinstance(value, tuple):
            value = [str(v) if isinstance(v, Path) else v for v in value]
        elif isinstance(value, Path):
            value = str(value)
        out[flag] = value
    out["force"] = True  # a replay rebuilds the bundle the config came from
    return out


def _colour() -> bool:
    from toolkit.reporting.terminal import stdout_is_terminal

    return stdout_is_terminal()


def _finish(result: Any, as_json: bool, *, next_hint: bool = True) -> None:
    from toolkit.reporting.terminal import run_summary

    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(run_summary(result, colour=_colour()), color=_colour())
        if result.passed and next_hint:
            click.echo(f"next: edgetk report {result.bundle_dir} --html report.html", err=True)
    if result.exit_code:
        raise SystemExit(result.exit_code)


@click.command("run")
@click.argument("source", required=False)
@convert_options
@device_options
@_check_options
@click.option("--force-deploy", is_flag=True,
              help="Deploy even if the bundle's target arch differs from the device's.")
@click.option("--config", "config", type=click.Path(path_type=Path), default=None,
              help="Replay a run: a run.toml (or a bundle made by `edgetk run`); flags given beside it win.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (docs/schemas/run.md).")
@click.pass_context
def run(ctx: click.Context, **values: Any) -> None:
    """Convert SOURCE, deploy the bundle to the devices and check it there, in one go.

    Stops at the first stage that fails, with that stage's exit code. The options are kept in the bundle
    (run.toml) so `edgetk run --config BUNDLE/run.toml` does the same run again.
    """
    from toolkit import api
    from toolkit.cli.options import build_convert_options
    from toolkit.errors import UsageError
    from toolkit.reporting.progress import StageProgress

    if values.get("config") is not None:
        _apply_config(ctx, values, values["config"])
    source = values.get("source")
    if not source:
        raise UsageError("No SOURCE given.", hint="Pass a model path, or --config FILE to replay a run.")
    options = build_convert_options(str(source), values)  # parses --input-shape etc. exactly as convert does
    progress = StageProgress()
    config = _record(ctx, values)
    result = api.run(
        source,
        devices=values.get("devices") or (), inventory=values.get("inventory"), group=values.get("group"),
        parallel=values["parallel"], trust_new_host=values["trust_new_host"], known_hosts=values.get("known_hosts"),
        runs=values["runs"], warmup=values["warmup"], budget_ms=values.get("budget_ms"),
        baseline=values["baseline"], regression_pct=values["regression_pct"], store=values.get("store"),
        deploy_force=values["force_deploy"], progress=progress, progress_stream=progress.stream("deploy"),
        config=config, **_convert_keywords(options),
    )
    _finish(result, values["as_json"])


def _convert_keywords(options: Any) -> dict[str, Any]:
    from toolkit.api import _CONVERT_KEYS

    return {key: getattr(options, key) for key in _CONVERT_KEYS}


@click.command("quickstart")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Where to write the example bundle (default ./bundles/digits-<this machine's target>).")
@click.option("--runs", type=click.IntRange(1), default=30, show_default=True, help="Timed runs per artifact.")
@click.option("--store", type=click.Path(path_type=Path), default=None,
              help="Check history file (default $EDGETK_STORE or ~/.local/share/edgetk/history.sqlite).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (as `edgetk run --json`).")
def quickstart(out: Path | None, runs: int, store: Path | None, as_json: bool) -> None:
    """The whole job on this machine, nothing to bring: a small digits model, trained once and cached, is
    converted for this machine's target profile, deployed to `local` and checked there."""
    from toolkit.example import quickstart as do_quickstart
    from toolkit.reporting.progress import StageProgress

    progress = StageProgress(stages=("convert", "deploy", "check"))
    result = do_quickstart(out=out, store=store, runs=runs, progress=progress,
                           progress_stream=progress.stream("deploy"))
    _finish(result, as_json, next_hint=False)
    if not as_json:
        click.echo(f"\ngo on with:\n  edgetk report {result.bundle_dir} --html report.html\n"
                   f"  edgetk inspect {result.bundle_dir}\n"
                   f"  edgetk deploy {result.bundle_dir} --device user@your-pi --check")
