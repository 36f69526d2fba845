"""The whole job in one verb: ``run`` (convert -> deploy -> check, stopping at the first stage that fails) and
``quickstart`` (the bundled example on this machine)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from toolkit.api.fleet import bundle_task, selection_of
from toolkit.api.keywords import RunKeywords
from toolkit.api.local import convert
from toolkit.api.results import PathLike, Progress, RunResult
from toolkit.model.options import (
    CheckOptions,
    ConvertOptions,
    DeviceOptions,
    build,
    split_keywords,
    with_option_keywords,
)

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.api.rollout import TextSink


@with_option_keywords(ConvertOptions, DeviceOptions, CheckOptions)
def run(
    source: PathLike,
    *,
    deploy_force: bool = False,
    break_lock: bool = False,
    progress: Progress | None = None,
    progress_stream: TextSink | None = sys.stderr,
    config: Mapping[str, object] | None = None,
    **options: Unpack[RunKeywords],
) -> RunResult:
    """``edgetk run``: convert -> deploy -> check, stopping at the first stage that fails.

    ``options`` are :func:`convert`'s keywords (target, calibration, precisions, ...), the device selection
    and the check options. The devices and options are resolved before anything is converted, so a bad spec
    fails fast. ``config`` (the effective options, as ``edgetk run`` records them) is written to the bundle as
    ``run.toml`` so the run can be replayed.
    """
    convert_values, device_values, check_values = split_keywords(
        "run", options, ConvertOptions, DeviceOptions, CheckOptions)
    selection = selection_of(build(DeviceOptions, device_values))
    checking = build(CheckOptions, check_values)  # refuses bad values before converting
    converted = convert(source, progress=progress, **convert_values)
    if config:
        from toolkit.model.runconfig import write_run_config

        write_run_config(converted.bundle_dir, config)
    names = ", ".join(s.name for s in selection.specs)
    _enter(progress, "deploy", f"deploying {converted.manifest.name} to {names}")
    deployed = bundle_task(converted.bundle_dir, selection, checking, install=True, check=False,
                            force=deploy_force, progress_stream=progress_stream, break_lock=break_lock)
    if not deployed.passed:
        return RunResult(converted, deployed, None, dict(config or {}))
    _enter(progress, "check", f"checking {converted.manifest.name} on {names}")
    checked = bundle_task(converted.bundle_dir, selection, checking, install=False, check=True, force=False,
                           progress_stream=None)
    return RunResult(converted, deployed, checked, dict(config or {}))


def quickstart(*, out: PathLike | None = None, store: PathLike | None = None, runs: int = 30,
               progress: Progress | None = None, progress_stream: TextSink | None = sys.stderr) -> RunResult:
    """``edgetk quickstart``: the bundled digits example (trained once, cached) converted for this machine's
    profile, deployed to ``local`` and checked there (``toolkit.example`` holds the example itself)."""
    from toolkit import example
    from toolkit.devices.spec import DeviceSpec
    from toolkit.model.platform import host_profile_name

    say = progress or (lambda message: print(message, file=sys.stderr, flush=True))
    source = example.model_path(say)
    data = example.data_dir()
    target = host_profile_name()
    say(f"this machine matches the target profile {target}")
    name = f"digits-{target}"
    destination = Path(out) if out else Path("bundles") / name
    # The runner on `local` runs with this very interpreter: it has numpy and the runtimes edgetk installed.
    here = DeviceSpec(name="local", python=sys.executable)
    config = {
        "source": str(source), "target": target, "calibration": str(data / "calibration.npz"),
        "eval-data": str(data / "eval.npz"), "labels": str(data / "labels.txt"), "name": name,
        "out": str(destination.resolve()), "force": True, "device": ["local"], "runs": runs, "warmup": 5,
        "baseline": "none",
    }
    return run(
        source, target=target, calibration=data / "calibration.npz", eval_data=data / "eval.npz",
        labels=data / "labels.txt", name=name, out=destination, force=True, devices=[here], runs=runs, warmup=5,
        baseline="none", store=store, progress=say, progress_stream=progress_stream, config=config,
    )


def _enter(progress: Progress | None, stage: str, message: str) -> None:
    """Tell a stage-aware progress (``reporting.progress.StageProgress``) the stage, then the step."""
    if progress is None:
        return
    enter = getattr(progress, "enter", None)
    if callable(enter):
        enter(stage)
    progress(message)

