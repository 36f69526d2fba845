"""The public Python API: the CLI's commands as keyword-only functions that return the data the CLI prints.

::

    import toolkit

    built = toolkit.convert("digits.keras", target="raspberry-pi-4", calibration="calib.npz")
    fleet = toolkit.deploy(built.bundle_dir, devices=["pi@192.168.1.40"], check=True, budget_ms=50)
    print(fleet.passed, fleet.to_dict())            # the same document as `edgetk deploy --check --json`
    result = toolkit.run("digits.keras", devices=["local"], calibration="calib.npz")
    print(result.exit_code, result.to_dict())       # the same document as `edgetk run --json`

Errors are raised as the toolkit's exception types (``toolkit.errors``: UsageError, ConversionError,
DeviceError...), each with ``message``, ``hint`` and ``exit_code``. A device that fails inside a fleet is not
an exception: its :class:`DeviceResult` says what went wrong, as in the CLI, and the fleet's ``exit_code``
follows the contract (4 device error, else 2, else 1 gate failed, else 0).

Heavy frameworks load only inside the functions that need them; ``import toolkit.api`` is light.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from toolkit.devices.spec import DeviceSpec
from toolkit.errors import UsageError, worst_exit_code
from toolkit.types import CheckReport, Manifest

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.deployment import PushResult
    from toolkit.inspection import ModelInfo
    from toolkit.pipeline import ConvertResult

__all__ = [
    "BundleInspection",
    "DeviceResult",
    "FleetReport",
    "RunResult",
    "check",
    "convert",
    "deploy",
    "inspect",
    "optimize",
    "probe",
    "quickstart",
    "remove",
    "rollback",
    "run",
    "status",
]

class TextSink(Protocol):
    """Where progress lines go: a text stream (``sys.stderr``) or anything with ``write`` and ``flush``."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


PathLike = str | Path
DeviceLike = str | DeviceSpec
Progress = Callable[[str], None]

# The check options and their defaults, shared by deploy(), check(), run() and `edgetk run`.
CHECK_DEFAULTS: Mapping[str, Any] = {
    "runs": 50,
    "warmup": 5,
    "budget_ms": None,
    "baseline": "last",
    "regression_pct": 10.0,
}


# --------------------------------------------------------------------------------------------- result types


@dataclass(frozen=True)
class DeviceResult:
    """One device's outcome: installed (``push``), checked (``reports``), or the error that stopped it."""

    device: str
    ok: bool
    error: str | None
    exit_code: int
    push: PushResult | None = None
    reports: tuple[CheckReport, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)  # rollback/status/remove/probe answers

    def to_dict(self) -> dict[str, Any]:
        """The device's entry of the CLI's ``--json`` document (docs/schemas/deploy.md)."""
        out: dict[str, Any] = {
            "device": self.device,
            "ok": self.ok,
            "error": self.error,
            "reports": [r.to_dict() for r in self.reports],
        }
        if self.push is not None:
            out["deploy"] = self.push.to_dict()
        out.update(self.data)
        return out


@dataclass(frozen=True)
class FleetReport:
    """What ``deploy``/``check``/``rollback``/``status``/``remove``/``probe`` did on every device."""

    devices: tuple[DeviceResult, ...]

    @property
    def exit_code(self) -> int:
        return worst_exit_code([d.exit_code for d in self.devices])

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def succeeded(self) -> tuple[DeviceResult, ...]:
        return tuple(d for d in self.devices if d.ok)

    @property
    def failed(self) -> tuple[DeviceResult, ...]:
        return tuple(d for d in self.devices if not d.ok)

    @property
    def reports(self) -> tuple[CheckReport, ...]:
        return tuple(r for d in self.devices for r in d.reports)

    def to_dict(self) -> dict[str, Any]:
        """``{"passed", "devices": [...]}``: the document ``edgetk deploy|check --json`` prints."""
        return {"passed": self.passed, "devices": [d.to_dict() for d in self.devices]}


@dataclass(frozen=True)
class BundleInspection:
    """``inspect`` of a bundle directory: its manifest and every artifact's inspection."""

    bundle: Path
    manifest: Manifest
    artifacts: tuple[ModelInfo, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle),
            "manifest": self.manifest.to_dict(),
            "artifacts": [a.to_dict() for a in self.artifacts],
        }


@dataclass(frozen=True)
class RunResult:
    """``run``: the bundle that convert made, then what deploy and check did on every device.

    ``failed_stage`` is None when every stage passed, else ``"deploy"`` or ``"check"`` (a failed convert
    raises instead, as ``convert`` does). ``exit_code`` is that stage's code.
    """

    converted: ConvertResult
    deployed: FleetReport | None
    checked: FleetReport | None
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def failed_stage(self) -> str | None:
        if self.deployed is not None and not self.deployed.passed:
            return "deploy"
        if self.checked is not None and not self.checked.passed:
            return "check"
        return None

    @property
    def exit_code(self) -> int:
        if self.deployed is not None and not self.deployed.passed:
            return self.deployed.exit_code
        return self.checked.exit_code if self.checked is not None else 0

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def bundle_dir(self) -> Path:
        return self.converted.bundle_dir

    @property
    def manifest(self) -> Manifest:
        return self.converted.manifest

    @property
    def devices(self) -> tuple[DeviceResult, ...]:
        """Per device: its push and its check reports merged (as the CLI prints them)."""
        checked = {d.device: d for d in self.checked.devices} if self.checked else {}
        out = []
        for dep in self.deployed.devices if self.deployed else ():
            chk = checked.get(dep.device)
            if chk is None:
                out.append(dep)
                continue
            out.append(DeviceResult(dep.device, chk.ok, chk.error, chk.exit_code, dep.push, chk.reports))
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        """The document ``edgetk run --json`` prints (docs/schemas/run.md)."""
        return {
            "passed": self.passed,
            "exit_code": self.exit_code,
            "failed_stage": self.failed_stage,
            "bundle": str(self.converted.bundle_dir),
            "cached": self.converted.cached,
            "config": dict(self.config),
            "manifest": self.converted.manifest.to_dict(),
            "devices": [d.to_dict() for d in self.devices],
        }


# --------------------------------------------------------------------------------------------- convert, inspect


def convert(
    source: PathLike,
    *,
    target: str | None = None,
    calibration: PathLike | None = None,
    eval_data: PathLike | None = None,
    precisions: Sequence[str] = (),
    formats: Sequence[str] = (),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    name: str | None = None,
    out: PathLike | None = None,
    force: bool = False,
    calibration_samples: int | None = None,
    calibration_method: str | None = None,
    labels: PathLike | None = None,
    weights: PathLike | None = None,
    targets_dirs: Sequence[PathLike] = (),
    dynamic_batch: bool = False,
    io_dtype: str | None = None,
    threads: int | None = None,
    use_cache: bool = True,
    progress: Progress | None = None,
) -> ConvertResult:
    """``edgetk convert``: build, verify and write a bundle; returns ``ConvertResult(bundle_dir, manifest, cached)``."""
    from toolkit.pipeline import convert_bundle

    options = convert_options(
        source, target=target, calibration=calibration, eval_data=eval_data, precisions=precisions,
        formats=formats, input_shapes=input_shapes, name=name, out=out, force=force,
        calibration_samples=calibration_samples, calibration_method=calibration_method, labels=labels,
        weights=weights, targets_dirs=targets_dirs, dynamic_batch=dynamic_batch, io_dtype=io_dtype,
        threads=threads, use_cache=use_cache,
    )
    if progress is None:
        return convert_bundle(options)
    return convert_bundle(options, progress=progress)


def convert_options(source: PathLike, **values: Any) -> Any:
    """``ConvertOptions`` from keyword values (paths as str or Path, sequences as lists or tuples)."""
    from toolkit.pipeline import ConvertOptions

    def path(value: Any) -> Path | None:
        return None if value is None else Path(value)

    shapes = values.get("input_shapes") or {}
    return ConvertOptions(
        source=str(source),
        target=values.get("target"),
        calibration=path(values.get("calibration")),
        eval_data=path(values.get("eval_data")),
        precisions=tuple(values.get("precisions") or ()),
        formats=tuple(values.get("formats") or ()),
        input_shapes={str(k): tuple(int(d) for d in v) for k, v in dict(shapes).items()},
        name=values.get("name"),
        out=path(values.get("out")),
        force=bool(values.get("force")),
        calibration_samples=values.get("calibration_samples"),
        labels=path(values.get("labels")),
        weights=path(values.get("weights")),
        targets_dirs=tuple(Path(p) for p in values.get("targets_dirs") or ()),
        dynamic_batch=bool(values.get("dynamic_batch")),
        io_dtype=values.get("io_dtype"),
        calibration_method=values.get("calibration_method"),
        threads=values.get("threads"),
        use_cache=bool(values.get("use_cache", True)),
    )


def inspect(path: PathLike) -> ModelInfo | BundleInspection:
    """``edgetk inspect``: a ``ModelInfo`` for a .tflite/.onnx file, a ``BundleInspection`` for a bundle."""
    from toolkit.bundle import read_bundle
    from toolkit.inspection import inspect_model

    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist.", hint="Pass a .tflite, an .onnx or a bundle directory.")
    if path.is_dir():
        bundle = read_bundle(path)
        return BundleInspection(
            path, bundle.manifest, tuple(inspect_model(path / a.file) for a in bundle.manifest.artifacts)
        )
    return inspect_model(path)


# --------------------------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class _Selection:
    specs: tuple[DeviceSpec, ...]
    parallel: int
    trust_new_host: bool
    known_hosts: str | None

    def run(self, task: Callable[[Any, DeviceSpec], Any]) -> list[tuple[DeviceSpec, Any]]:
        """``task(device, spec)`` on every device (connection opened and closed around it), concurrently."""
        from toolkit.devices import open_connection
        from toolkit.devices.fleet import run_fleet

        def one(spec: DeviceSpec) -> Any:
            from toolkit.deployment import Device

            with open_connection(
                spec, trust_new_host=self.trust_new_host, known_hosts=self.known_hosts or spec.known_hosts
            ) as conn:
                return task(Device(spec, conn), spec)

        result = run_fleet(self.specs, one, parallel=self.parallel)
        return [(spec, outcome) for spec, outcome in zip(self.specs, result.outcomes)]


def select_devices(
    devices: Iterable[DeviceLike] = (),
    *,
    inventory: PathLike | None = None,
    group: str | None = None,
    parallel: int = 8,
    trust_new_host: bool = False,
    known_hosts: PathLike | None = None,
) -> _Selection:
    """The devices named by specs (``local``, ``user@host[:port]``, aliases, inventory names) or an inventory."""
    from toolkit.devices.inventory import resolve_specs

    if isinstance(devices, (str, DeviceSpec)):
        devices = [devices]
    if parallel < 1:
        raise UsageError(f"parallel must be at least 1, got {parallel}.")
    specs = resolve_specs(
        [d if isinstance(d, DeviceSpec) else str(d) for d in devices],
        inventory=Path(inventory) if inventory else None,
        group=group,
    )
    return _Selection(specs, parallel, trust_new_host, str(known_hosts) if known_hosts else None)


def _result(spec: DeviceSpec, outcome: Any, *, gated: bool) -> DeviceResult:
    """A fleet outcome -> DeviceResult; a failed gate makes the device not ok with exit code 1."""
    value = outcome.value
    push = reports = None
    data: Mapping[str, Any] = {}
    if isinstance(value, tuple):
        push, reports = value
    elif isinstance(value, Mapping):
        data = value
    reports = tuple(reports or ())
    failed = [r for r in reports if not r.gates.passed] if gated else []
    code = outcome.exit_code or (1 if failed else 0)
    error = outcome.error
    if error is None and failed:
        error = "; ".join(
            reason for r in failed for reason in r.gates.reasons if not reason.startswith("skipped")
        )
    return DeviceResult(outcome.device, code == 0, error, code, push, reports, data)


def _bundle_task(
    bundle_path: PathLike,
    selection: _Selection,
    *,
    install: bool,
    check: bool,
    force: bool,
    compress: bool = False,
    runs: int,
    warmup: int,
    budget_ms: float | None,
    baseline: str,
    regression_pct: float,
    store: PathLike | None,
    progress_stream: TextSink | None,
) -> FleetReport:
    from toolkit.rollout import prepare_job

    job = prepare_job(bundle_path, install=install, check=check, force=force, compress=compress, runs=runs,
                      warmup=warmup, budget_ms=budget_ms, baseline=baseline, regression_pct=regression_pct,
                      store=store)
    outcomes = selection.run(lambda device, spec: job.run(device, progress_stream=progress_stream))
    return FleetReport(tuple(_result(s, o, gated=check) for s, o in outcomes))


def deploy(
    bundle: PathLike,
    *,
    devices: Iterable[DeviceLike] = (),
    inventory: PathLike | None = None,
    group: str | None = None,
    parallel: int = 8,
    trust_new_host: bool = False,
    known_hosts: PathLike | None = None,
    check: bool = False,
    runs: int = CHECK_DEFAULTS["runs"],
    warmup: int = CHECK_DEFAULTS["warmup"],
    budget_ms: float | None = None,
    baseline: str = CHECK_DEFAULTS["baseline"],
    regression_pct: float = CHECK_DEFAULTS["regression_pct"],
    store: PathLike | None = None,
    force: bool = False,
    compress: bool = False,
    progress_stream: TextSink | None = sys.stderr,
) -> FleetReport:
    """``edgetk deploy``: push the bundle to every device, verify it there, make it current; ``check=True``
    checks it right after; ``compress=True`` sends files gzip-compressed where that pays. Upload progress goes
    to ``progress_stream`` (None: quiet)."""
    selection = select_devices(devices, inventory=inventory, group=group, parallel=parallel,
                               trust_new_host=trust_new_host, known_hosts=known_hosts)
    return _bundle_task(
        bundle, selection, install=True, check=check, force=force, compress=compress, runs=runs, warmup=warmup,
        budget_ms=budget_ms,
        baseline=baseline, regression_pct=regression_pct, store=store,
        progress_stream=progress_stream if progress_stream is not None else _Null(),
    )


def check(
    bundle: PathLike,
    *,
    devices: Iterable[DeviceLike] = (),
    inventory: PathLike | None = None,
    group: str | None = None,
    parallel: int = 8,
    trust_new_host: bool = False,
    known_hosts: PathLike | None = None,
    runs: int = CHECK_DEFAULTS["runs"],
    warmup: int = CHECK_DEFAULTS["warmup"],
    budget_ms: float | None = None,
    baseline: str = CHECK_DEFAULTS["baseline"],
    regression_pct: float = CHECK_DEFAULTS["regression_pct"],
    store: PathLike | None = None,
) -> FleetReport:
    """``edgetk check``: run the deployed bundle on every device, gate the reports, record them in the store."""
    selection = select_devices(devices, inventory=inventory, group=group, parallel=parallel,
                               trust_new_host=trust_new_host, known_hosts=known_hosts)
    return _bundle_task(
        bundle, selection, install=False, check=True, force=False, runs=runs, warmup=warmup, budget_ms=budget_ms,
        baseline=baseline, regression_pct=regression_pct, store=store, progress_stream=None,
    )


def _simple(selection: _Selection, action: Callable[[Any], Mapping[str, Any]]) -> FleetReport:
    outcomes = selection.run(lambda device, spec: dict(action(device)))
    return FleetReport(tuple(_result(s, o, gated=False) for s, o in outcomes))


def rollback(name: str, *, devices: Iterable[DeviceLike] = (), inventory: PathLike | None = None,
             group: str | None = None, parallel: int = 8, trust_new_host: bool = False,
             known_hosts: PathLike | None = None) -> FleetReport:
    """``edgetk rollback``: bundle ``name``'s ``current`` back to the previous version on every device."""
    from toolkit.deployment import rollback as do_rollback

    selection = select_devices(devices, inventory=inventory, group=group, parallel=parallel,
                               trust_new_host=trust_new_host, known_hosts=known_hosts)
    return _simple(selection, lambda device: do_rollback(device, name))


def status(*, devices: Iterable[DeviceLike] = (), inventory: PathLike | None = None, group: str | None = None,
           parallel: int = 8, trust_new_host: bool = False, known_hosts: PathLike | None = None) -> FleetReport:
    """``edgetk status``: the bundles and versions installed on every device (``data["bundles"]``)."""
    from toolkit.deployment import status as do_status

    selection = select_devices(devices, inventory=inventory, group=group, parallel=parallel,
                               trust_new_host=trust_new_host, known_hosts=known_hosts)
    return _simple(selection, lambda device: {"bundles": do_status(device).get("bundles", {})})


def remove(name: str, *, devices: Iterable[DeviceLike] = (), inventory: PathLike | None = None,
           group: str | None = None, parallel: int = 8, trust_new_host: bool = False,
           known_hosts: PathLike | None = None) -> FleetReport:
    """``edgetk remove``: delete bundle ``name`` (every version) from every device."""
    from toolkit.deployment import remove as do_remove

    selection = select_devices(devices, inventory=inventory, group=group, parallel=parallel,
                               trust_new_host=trust_new_host, known_hosts=known_hosts)
    return _simple(selection, lambda device: do_remove(device, name))


def probe(*, devices: Iterable[DeviceLike] = (), inventory: PathLike | None = None, group: str | None = None,
          parallel: int = 8, trust_new_host: bool = False, known_hosts: PathLike | None = None) -> FleetReport:
    """``edgetk devices probe``: arch, OS, CPU, memory, runtimes and best profile (``data["probe"]``)."""
    from toolkit.devices.probe import probe_device

    selection = select_devices(devices, inventory=inventory, group=group, parallel=parallel,
                               trust_new_host=trust_new_host, known_hosts=known_hosts)
    return _simple(selection, lambda device: {"probe": probe_device(device)})


def optimize(source: PathLike, **options: Any) -> Any:
    """``edgetk optimize``: compress a Keras 3 or PyTorch model (see ``toolkit.optimization.optimize``)."""
    from toolkit.optimization import optimize as do_optimize

    return do_optimize(str(source), **options)


def quickstart(*, out: PathLike | None = None, store: PathLike | None = None, runs: int = 30,
               progress: Progress | None = None) -> RunResult:
    """``edgetk quickstart``: the bundled digits example converted, deployed to ``local`` and checked."""
    from toolkit.example import quickstart as do_quickstart

    result: RunResult = do_quickstart(out=Path(out) if out else None, store=Path(store) if store else None,
                                      runs=runs, progress=progress)
    return result


# --------------------------------------------------------------------------------------------- run


def run(
    source: PathLike,
    *,
    devices: Iterable[DeviceLike] = (),
    inventory: PathLike | None = None,
    group: str | None = None,
    parallel: int = 8,
    trust_new_host: bool = False,
    known_hosts: PathLike | None = None,
    runs: int = CHECK_DEFAULTS["runs"],
    warmup: int = CHECK_DEFAULTS["warmup"],
    budget_ms: float | None = None,
    baseline: str = CHECK_DEFAULTS["baseline"],
    regression_pct: float = CHECK_DEFAULTS["regression_pct"],
    store: PathLike | None = None,
    deploy_force: bool = False,
    progress: Progress | None = None,
    progress_stream: TextSink | None = sys.stderr,
    config: Mapping[str, Any] | None = None,
    **convert_values: Any,
) -> RunResult:
    """``edgetk run``: convert -> deploy -> check, stopping at the first stage that fails.

    ``convert_values`` are :func:`convert`'s keywords (target, calibration, precisions, ...). The devices are
    resolved before anything is converted, so a bad spec fails fast. ``config`` (the effective options, as
    ``edgetk run`` records them) is written to the bundle as ``run.toml`` so the run can be replayed.
    """
    unknown = set(convert_values) - set(_CONVERT_KEYS)
    if unknown:
        raise TypeError(f"run() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    selection = select_devices(devices, inventory=inventory, group=group, parallel=parallel,
                               trust_new_host=trust_new_host, known_hosts=known_hosts)
    from toolkit.checking import GateOptions

    GateOptions(budget_ms=budget_ms, baseline=baseline, regression_pct=regression_pct)  # refuse bad values early
    if runs < 1 or warmup < 0:
        raise UsageError(f"--runs must be at least 1 and --warmup at least 0 (got {runs} and {warmup}).")
    converted = convert(source, progress=progress, **convert_values)
    if config:
        from toolkit.runconfig import write_run_config

        write_run_config(converted.bundle_dir, config)
    stream = progress_stream if progress_stream is not None else _Null()
    _enter(progress, "deploy", f"deploying {converted.manifest.name} to {', '.join(s.name for s in selection.specs)}")
    common: dict[str, Any] = {"runs": runs, "warmup": warmup, "budget_ms": budget_ms, "baseline": baseline,
                              "regression_pct": regression_pct, "store": store}
    deployed = _bundle_task(converted.bundle_dir, selection, install=True, check=False, force=deploy_force,
                            progress_stream=stream, **common)
    if not deployed.passed:
        return RunResult(converted, deployed, None, dict(config or {}))
    _enter(progress, "check", f"checking {converted.manifest.name} on {', '.join(s.name for s in selection.specs)}")
    checked = _bundle_task(converted.bundle_dir, selection, install=False, check=True, force=False,
                           progress_stream=None, **common)
    return RunResult(converted, deployed, checked, dict(config or {}))


def _enter(progress: Progress | None, stage: str, message: str) -> None:
    """Tell a stage-aware progress (``reporting.progress.StageProgress``) the stage, then the step."""
    if progress is None:
        return
    enter = getattr(progress, "enter", None)
    if callable(enter):
        enter(stage)
    progress(message)


_CONVERT_KEYS = (
    "target", "calibration", "eval_data", "precisions", "formats", "input_shapes", "name", "out", "force",
    "calibration_samples", "calibration_method", "labels", "weights", "targets_dirs", "dynamic_batch", "io_dtype",
    "threads", "use_cache",
)


class _Null:
    """A text stream that drops what it is given (progress turned off)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None
