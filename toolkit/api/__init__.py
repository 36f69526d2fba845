"""The public Python API: the CLI's commands as keyword-only functions that return the data the CLI prints.

::

    import toolkit

    built = toolkit.convert("digits.keras", target="raspberry-pi-4", calibration="calib.npz")
    fleet = toolkit.deploy(built.bundle_dir, devices=["pi@192.168.1.40"], check=True, budget_ms=50)
    print(fleet.passed, fleet.to_dict())            # the same document as `edgetk deploy --check --json`
    result = toolkit.run("digits.keras", devices=["local"], calibration="calib.npz")
    print(result.exit_code, result.to_dict())       # the same document as `edgetk run --json`

Every command of ``edgetk`` calls exactly one function here and renders its result; ``result.to_dict()`` is
the command's ``--json`` document. The option groups several commands share (convert, device selection,
check) are defined once in :mod:`toolkit.model.options`; the functions take them as keywords (listed in their
signatures) and refuse unknown ones with ``TypeError``.

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
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from toolkit.errors import UsageError, worst_exit_code
from toolkit.model.options import (
    CheckOptions,
    ConvertOptions,
    DeviceOptions,
    RolloutOptions,
    as_keywords,
    build,
    split_keywords,
    with_option_keywords,
)

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.conversion.layers import LayerTable
    from toolkit.delivery.deployment import PushResult
    from toolkit.devices.spec import DeviceSpec
    from toolkit.runtimes.inspection import ModelInfo
    from toolkit.conversion.pipeline import ConvertResult
    from toolkit.reporting.html import ReportData
    from toolkit.api.rollout import RolloutResult
    from toolkit.checks.selection import Selection
    from toolkit.delivery.mender import MenderExport
    from toolkit.store.guard import StoreStatus, SyncResult
    from toolkit.store.imports import ImportResult
    from toolkit.store import StoredCheck, Trend
    from toolkit.model.targets import TargetProfile
    from toolkit.model.device_records import CheckReport
    from toolkit.model.manifest import Manifest

__all__ = [
    "BundleInspection",
    "DeviceResult",
    "FleetReport",
    "History",
    "RunResult",
    "TargetCatalog",
    "TargetView",
    "check",
    "convert",
    "deploy",
    "export_mender",
    "history",
    "history_import",
    "history_sync",
    "inspect",
    "list_targets",
    "make_report",
    "optimize",
    "probe",
    "quickstart",
    "remove",
    "rollback",
    "run",
    "setup",
    "show_target",
    "status",
]


class TextSink(Protocol):
    """Where progress lines go: a text stream (``sys.stderr``) or anything with ``write`` and ``flush``."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


PathLike = str | Path
DeviceLike: TypeAlias = "str | DeviceSpec"
Progress = Callable[[str], None]


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
    selected: Selection | None = None  # the artifact this device selected by its check (toolkit.checks.selection)

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
        if self.selected is not None:
            out["selected"] = self.selected.to_dict()
        out.update(self.data)
        return out


@dataclass(frozen=True)
class FleetReport:
    """What ``deploy``/``check``/``rollback``/``status``/``remove``/``probe`` did on every device."""

    devices: tuple[DeviceResult, ...]
    store: StoreStatus | None = None  # where the check reports went (deploy --check, check)
    rollout: RolloutResult[Any] | None = None  # deploy --waves: the waves, why it stopped, the rollback

    @property
    def exit_code(self) -> int:
        codes = [d.exit_code for d in self.devices]
        if self.store is not None and not self.store.ok:
            codes.append(4)  # the history could not be reached: a device-class failure, as for a device
        if self.rollout is not None and self.rollout.stopped:
            codes.append(1)
        return worst_exit_code(codes)

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
        doc: dict[str, Any] = {"passed": self.passed, "devices": [d.to_dict() for d in self.devices]}
        if self.store is not None:
            doc["store"] = self.store.to_dict()
        if self.rollout is not None:
            doc["rollout"] = self.rollout.to_dict()
        return doc


@dataclass(frozen=True)
class BundleInspection:
    """``inspect`` of a bundle directory: its manifest and every artifact's inspection."""

    bundle: Path
    manifest: Manifest
    artifacts: tuple[ModelInfo, ...]
    layers: Mapping[str, LayerTable] | None = None  # inspect(layers=True): artifact file -> its layer-wise table

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "bundle": str(self.bundle),
            "manifest": self.manifest.to_dict(),
            "artifacts": [a.to_dict() for a in self.artifacts],
        }
        if self.layers is not None:
            doc["layers"] = {file: table.to_dict() for file, table in self.layers.items()}
        return doc


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




@dataclass(frozen=True)
class TargetCatalog:
    """``list_targets``: every profile, shipped and the user's."""

    profiles: tuple[TargetProfile, ...]

    def to_dict(self) -> list[dict[str, Any]]:
        """The document ``edgetk targets list --json`` prints: a list of profile summaries
        (docs/schemas/targets.md)."""
        return [
            {
                "name": p.name,
                "arch": p.arch,
                "description": p.description,
                "source": p.origin,
                "path": str(p.path) if p.path else None,
                "extends": p.extends,
                "preferred_recipe": p.preferred_recipe.label,
                "latency_budget_ms": p.latency_budget_ms,
                "edgetpu": p.edgetpu,
            }
            for p in self.profiles
        ]


@dataclass(frozen=True)
class TargetView:
    """``show_target``: one resolved profile (extends applied) and where it came from."""

    profile: TargetProfile

    def to_dict(self) -> dict[str, Any]:
        """The document ``edgetk targets show NAME --json`` prints."""
        data = dict(self.profile.to_dict())
        data["source"] = self.profile.origin
        return data


@dataclass(frozen=True)
class History:
    """``history``: the stored checks that match, oldest first, and the p50 trend per device/bundle/artifact."""

    checks: tuple[StoredCheck, ...]

    @property
    def trends(self) -> list[Trend]:
        from toolkit.store import trends

        return trends(list(self.checks))

    def to_dict(self) -> list[dict[str, Any]]:
        """The document ``edgetk history --json`` prints: a list of stored check reports."""
        return [c.to_dict() for c in self.checks]


# --------------------------------------------------------------------------------------------- convert, inspect


@with_option_keywords(ConvertOptions)
def convert(source: PathLike, *, progress: Progress | None = None, **options: Any) -> ConvertResult:
    """``edgetk convert``: build, verify and write a bundle; returns ``ConvertResult(bundle_dir, manifest, cached)``.

    ``options`` are :class:`toolkit.model.options.ConvertOptions`' fields (target, calibration, precisions, ...).
    """
    from toolkit.conversion.pipeline import convert_bundle

    built = convert_options(source, **options)
    if progress is None:
        return convert_bundle(built)
    return convert_bundle(built, progress=progress)


def convert_options(source: PathLike, **values: Any) -> ConvertOptions:
    """``ConvertOptions`` from keyword values (paths as str or Path, sequences as lists or tuples)."""
    (convert_values,) = split_keywords("convert", values, ConvertOptions)
    return build(ConvertOptions, convert_values, source=str(source))


def inspect(path: PathLike, *, layers: bool = False) -> ModelInfo | BundleInspection:
    """``edgetk inspect``: a ``ModelInfo`` for a .tflite/.onnx file, a ``BundleInspection`` for a bundle.

    ``layers``: also the layer-wise INT8 error table of each INT8 artifact (``layers/<artifact>.json``, written
    by convert; ``toolkit.conversion.layers``), worst layer first."""
    from toolkit.delivery.bundle import read_bundle
    from toolkit.runtimes.inspection import inspect_model

    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist.", hint="Pass a .tflite, an .onnx or a bundle directory.")
    if path.is_dir():
        bundle = read_bundle(path)
        tables = None
        if layers:
            from toolkit.conversion.layers import read_table

            found = {a.file: read_table(path, a.file) for a in bundle.manifest.artifacts}
            tables = {file: table for file, table in found.items() if table is not None}
        return BundleInspection(
            path, bundle.manifest, tuple(inspect_model(path / a.file) for a in bundle.manifest.artifacts), tables
        )
    if layers:
        raise UsageError(f"--layers needs a bundle directory; {path} is a single model file.",
                         hint="Pass the bundle that convert wrote: the layer-wise tables are kept there.")
    return inspect_model(path)


def list_targets(*, targets_dirs: Sequence[PathLike] = ()) -> TargetCatalog:
    """``edgetk targets list``: every target profile (the user's folders win over shipped ones of a name)."""
    from toolkit.model.targets import load_profiles

    return TargetCatalog(tuple(load_profiles(targets_dirs=tuple(Path(d) for d in targets_dirs)).values()))


def show_target(name: str, *, targets_dirs: Sequence[PathLike] = ()) -> TargetView:
    """``edgetk targets show NAME``: one resolved profile."""
    from toolkit.model.targets import get_profile

    return TargetView(get_profile(name, targets_dirs=tuple(Path(d) for d in targets_dirs)))


# --------------------------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class _Selection:
    specs: tuple[DeviceSpec, ...]
    options: DeviceOptions

    def run(self, task: Callable[[Any, DeviceSpec], Any]) -> list[tuple[DeviceSpec, Any]]:
        """``task(device, spec)`` on every device (connection opened and closed around it), concurrently."""
        from toolkit.devices import open_connection
        from toolkit.devices.fleet import run_fleet

        known_hosts = str(self.options.known_hosts) if self.options.known_hosts else None

        def one(spec: DeviceSpec) -> Any:
            from toolkit.delivery.deployment import Device

            with open_connection(
                spec, trust_new_host=self.options.trust_new_host, known_hosts=known_hosts or spec.known_hosts
            ) as conn:
                return task(Device(spec, conn), spec)

        result = run_fleet(self.specs, one, parallel=self.options.parallel)
        return [(spec, outcome) for spec, outcome in zip(self.specs, result.outcomes)]


@with_option_keywords(DeviceOptions)
def select_devices(devices: Iterable[DeviceLike] | DeviceLike = (), **options: Any) -> _Selection:
    """The devices named by specs (``local``, ``user@host[:port]``, aliases, inventory names) or an inventory."""
    (device_values,) = split_keywords("select_devices", {"devices": devices, **options}, DeviceOptions)
    return _select(build(DeviceOptions, device_values))


def _select(options: DeviceOptions) -> _Selection:
    from toolkit.devices.inventory import resolve_specs
    from toolkit.devices.spec import DeviceSpec

    devices: Any = options.devices
    if isinstance(devices, (str, DeviceSpec)):
        devices = [devices]
    specs = resolve_specs(
        [d if isinstance(d, DeviceSpec) else str(d) for d in devices],
        inventory=Path(options.inventory) if options.inventory else None,
        group=options.group,
        limit=options.limit,
    )
    return _Selection(specs, options)


def _result(spec: DeviceSpec, outcome: Any, *, gated: bool) -> DeviceResult:
    """A fleet outcome -> DeviceResult; a failed gate makes the device not ok with exit code 1."""
    value = outcome.value
    push = reports = selected = None
    data: Mapping[str, Any] = {}
    if isinstance(value, tuple):
        push, reports, selected = value
    elif isinstance(value, Mapping):
        data = value
    reports = tuple(reports or ())
    failed = [r for r in reports if not r.gates.passed] if gated else []
    nothing = gated and selected is not None and selected.artifact is None  # nothing passes: exit 1, say why
    code = outcome.exit_code or (1 if failed or nothing else 0)
    error = outcome.error
    if error is None and (failed or nothing):
        error = "; ".join([failure for r in failed for failure in r.gates.failures]
                          + ([f"nothing selected: {selected.reason}"] if nothing and selected else []))
    return DeviceResult(outcome.device, code == 0, error, code, push, reports, data, selected)


def _bundle_task(
    bundle_path: PathLike,
    selection: _Selection,
    checking: CheckOptions,
    *,
    install: bool,
    check: bool,
    force: bool,
    compress: bool = False,
    progress_stream: TextSink | None,
    rollout: RolloutOptions | None = None,
    break_lock: bool = False,
    prune: bool = False,
    pin: str | None = None,
) -> FleetReport:
    from toolkit.api.rollout import prepare_job

    job = prepare_job(bundle_path, install=install, check=check, force=force, compress=compress,
                      break_lock=break_lock, prune=prune, pin=pin, **as_keywords(checking))
    stream = progress_stream if progress_stream is not None else _Null()
    if rollout is not None and rollout.waves:
        from toolkit.devices.fleet import FleetResult
        from toolkit.api.rollout import deploy_in_waves
        from toolkit.model.waves import FailureLimit, WavePlan

        def run_on(batch: Sequence[DeviceSpec], task: Callable[[Any, DeviceSpec], Any]) -> FleetResult[Any]:
            return FleetResult(tuple(o for _, o in _Selection(tuple(batch), selection.options).run(task)))

        staged = deploy_in_waves(job, selection.specs, run_on=run_on, plan=WavePlan.parse(rollout.waves),
                                 max_failures=FailureLimit.parse(rollout.max_failures),
                                 rollback_on_failure=rollout.rollback_on_failure, progress_stream=stream)
        by_name = {s.name: s for s in selection.specs}
        results = tuple(_result(by_name[o.device], o, gated=check) for o in staged.outcomes)
        return FleetReport(results, store=job.store_status(), rollout=staged)
    outcomes = selection.run(lambda device, spec: job.run(device, progress_stream=stream))
    return FleetReport(tuple(_result(s, o, gated=check) for s, o in outcomes), store=job.store_status())


@with_option_keywords(DeviceOptions, CheckOptions, RolloutOptions)
def deploy(bundle: PathLike, *, check: bool = False, force: bool = False, compress: bool = False,
           break_lock: bool = False, prune: bool = False, progress_stream: TextSink | None = sys.stderr,
           **options: Any) -> FleetReport:
    """``edgetk deploy``: push the bundle to every device, verify it there, make it current; ``check=True``
    checks it right after; ``compress=True`` sends files gzip-compressed where that pays; ``force=True``
    deploys to a device of another arch than the bundle's target; ``break_lock=True`` breaks the bundle's lock
    whoever holds it; ``prune=True`` removes old versions (never the current or rollback target) when the
    disk is short. Upload progress goes to ``progress_stream`` (None: quiet). ``options``: the device selection
    and check options (:mod:`toolkit.model.options`)."""
    device_values, check_values, rollout_values = split_keywords("deploy", options, DeviceOptions, CheckOptions,
                                                                 RolloutOptions)
    checking = build(CheckOptions, check_values)
    rollout = build(RolloutOptions, rollout_values)
    selection = _select(build(DeviceOptions, device_values))
    return _bundle_task(bundle, selection, checking, install=True, check=check, force=force, compress=compress,
                        progress_stream=progress_stream, rollout=rollout, break_lock=break_lock, prune=prune)


@with_option_keywords(DeviceOptions, CheckOptions)
def check(bundle: PathLike, *, select: str | None = None, progress_stream: TextSink | None = None,
          **options: Any) -> FleetReport:
    """``edgetk check``: run the deployed bundle on every device, gate the reports, record them in the store;
    each device then selects the artifact it runs (toolkit.checks.selection); ``select=FILE`` pins that one."""
    device_values, check_values = split_keywords("check", options, DeviceOptions, CheckOptions)
    checking = build(CheckOptions, check_values)
    selection = _select(build(DeviceOptions, device_values))
    return _bundle_task(bundle, selection, checking, install=False, check=True, force=False,
                        progress_stream=progress_stream, pin=select)


def _simple(caller: str, options: Mapping[str, Any], action: Callable[[Any], Mapping[str, Any]]) -> FleetReport:
    (device_values,) = split_keywords(caller, options, DeviceOptions)
    selection = _select(build(DeviceOptions, device_values))
    outcomes = selection.run(lambda device, spec: dict(action(device)))
    return FleetReport(tuple(_result(s, o, gated=False) for s, o in outcomes))


@with_option_keywords(DeviceOptions)
def rollback(name: str, *, break_lock: bool = False, **options: Any) -> FleetReport:
    """``edgetk rollback``: bundle ``name``'s ``current`` back to the previous version on every device."""
    from toolkit.delivery.deployment import rollback as do_rollback

    return _simple("rollback", options, lambda device: do_rollback(device, name, break_lock=break_lock))


@with_option_keywords(DeviceOptions)
def status(**options: Any) -> FleetReport:
    """``edgetk status``: the bundles and versions installed on every device (``data["bundles"]``)."""
    from toolkit.delivery.deployment import status as do_status

    return _simple("status", options, lambda device: {"bundles": do_status(device).get("bundles", {})})


@with_option_keywords(DeviceOptions)
def remove(name: str, *, break_lock: bool = False, **options: Any) -> FleetReport:
    """``edgetk remove``: delete bundle ``name`` (every version) from every device."""
    from toolkit.delivery.deployment import remove as do_remove

    return _simple("remove", options, lambda device: do_remove(device, name, break_lock=break_lock))


@with_option_keywords(DeviceOptions)
def prune(name: str, *, keep: int = 2, break_lock: bool = False, **options: Any) -> FleetReport:
    """``edgetk prune``: remove old versions of bundle ``name`` on every device, keeping the current version and
    the ``keep - 1`` installed before it, always the rollback target (``data``: removed, kept, freed_bytes)."""
    from toolkit.delivery.deployment import prune as do_prune

    if keep < 1:
        raise UsageError(f"--keep must be at least 1, got {keep}.", hint="The current version is always kept.")
    return _simple("prune", options, lambda device: do_prune(device, name, keep=keep, break_lock=break_lock))


@with_option_keywords(DeviceOptions)
def probe(**options: Any) -> FleetReport:
    """``edgetk devices probe``: arch, OS, CPU, memory, runtimes and best profile (``data["probe"]``)."""
    from toolkit.devices.probe import probe_device

    return _simple("probe", options, lambda device: {"probe": probe_device(device)})


@with_option_keywords(DeviceOptions)
def setup(*, runtimes: Sequence[str] = (), offline: bool = False, venv: str | None = None,
          target: str | None = None, progress: Progress | None = None, **options: Any) -> FleetReport:
    """``edgetk devices setup``: a venv on every device with numpy and its runtimes (``data["setup"]``).

    ``runtimes`` default to the ones the device's target profile runs; ``offline`` downloads wheels here
    and pushes them; ``venv`` is where the venv goes (default ``~/.edgetk/venv``); ``target`` names the
    profile whose runtime versions to install; ``progress`` gets ``"DEVICE: line"`` messages.
    """
    from toolkit.delivery.provisioning import DEFAULT_VENV, SetupOptions, setup_device

    (device_values,) = split_keywords("setup", options, DeviceOptions)
    selection = _select(build(DeviceOptions, device_values))
    if target:
        from toolkit.model.targets import get_profile

        get_profile(target)  # an unknown name is a usage error before any device is touched
    wanted = SetupOptions(runtimes=tuple(runtimes), offline=offline, venv=_venv_path(venv or DEFAULT_VENV),
                          target=target)

    def task(device: Any, spec: DeviceSpec) -> Mapping[str, Any]:
        def log(line: str) -> None:
            if progress is not None:
                progress(f"{spec.name}: {line}")

        return {"setup": setup_device(device, wanted, log=log).to_dict()}

    outcomes = selection.run(task)
    return FleetReport(tuple(_result(s, o, gated=False) for s, o in outcomes))


@with_option_keywords(DeviceOptions)
def add_key(*, public_key: PathLike | None = None, password_file: PathLike | None = None,
            password_env: str | None = None, ask: Callable[[], str] | None = None, **options: Any) -> FleetReport:
    """``edgetk devices add-key``: install the user's public key on every device over a password login, then prove
    a key login works; host keys are checked and recorded as ``devices probe --trust-new-host`` does.

    ``public_key``: the .pub file (default: the device's IdentityFile, else ~/.ssh/id_*.pub). The password, one
    for the whole fleet, comes from ``password_file`` (its first line), else the environment variable named
    ``password_env``, else ``ask()`` (a terminal prompt); it is never logged or stored (``data["add_key"]``).
    """
    from toolkit.devices.first_boot import add_keys

    (device_values,) = split_keywords("add_key", options, DeviceOptions)
    chosen = build(DeviceOptions, device_values)
    specs = _select(chosen).specs
    outcomes = add_keys(specs, public_key=public_key, password_file=password_file, password_env=password_env,
                        ask=ask, trust_new_host=chosen.trust_new_host, known_hosts=chosen.known_hosts,
                        parallel=chosen.parallel)
    return FleetReport(tuple(_result(s, o, gated=False) for s, o in zip(specs, outcomes)))


def _venv_path(text: str) -> str:
    """``~/x`` and relative paths are relative to the device user's home (the remote working directory)."""
    text = text.strip()
    if not text or "\x00" in text:
        raise UsageError("--venv needs a path.", hint="For example --venv ~/.edgetk/venv-legacy.")
    if text == "~":
        raise UsageError("--venv ~ would turn the home directory into a venv.", hint="Name a directory below it.")
    return text.removeprefix("~/")


# --------------------------------------------------------------------------------------------- history, report


def history(*, device: str | None = None, bundle: str | None = None, limit: int | None = None,
            store: PathLike | None = None) -> History:
    """``edgetk history``: the stored checks (of one device or bundle, the newest ``limit``)."""
    from toolkit.store import Store

    checks = Store(store).history(device=device, bundle=bundle, limit=limit)
    return History(tuple(checks))


def history_sync(*, store: PathLike | None = None, source: PathLike | None = None) -> SyncResult:
    """``edgetk history sync``: copy the results that ``--store-fallback`` kept locally into ``store`` (each
    check once, however often it runs), then empty the local file."""
    from toolkit.store import Store
    from toolkit.store.guard import sync

    return sync(Store(store), source=Path(source) if source is not None else None)


def history_import(paths: Sequence[PathLike], *, store: PathLike | None = None,
                   device: str | None = None) -> ImportResult:
    """``edgetk history import``: record the check reports that devices left (Mender update module)."""
    from toolkit.store import Store
    from toolkit.store.imports import import_reports

    return import_reports([Path(p) for p in paths], Store(store), device=device)


def export_mender(bundle: PathLike, *, device_types: Sequence[str], output: PathLike,
                  artifact_name: str | None = None, budget_ms: float | None = None, runs: int = 20,
                  warmup: int = 3, force: bool = False) -> MenderExport:
    """``edgetk export BUNDLE --mender``: a Mender module-image artifact of the bundle (and the ``edgetk``
    Update Module beside it), built with ``mender-artifact``."""
    from toolkit.delivery.mender import export_mender as write

    return write(bundle, device_types=tuple(device_types), output=output, artifact_name=artifact_name,
                 budget_ms=budget_ms, runs=runs, warmup=warmup, force=force)


def make_report(bundle: PathLike | None = None, *, whole_history: bool = False, html: PathLike | None = None,
                device: str | None = None, store: PathLike | None = None) -> ReportData:
    """``edgetk report``: a bundle's host and device measurements, or (``whole_history``) every stored check
    and the trends; ``html`` also writes the self-contained page there."""
    from toolkit.reporting.html import collect, write_html

    if (bundle is None) == (not whole_history):
        raise UsageError("Pass either a BUNDLE directory or --history.",
                         hint="edgetk report bundles/NAME --html report.html, or edgetk report --history")
    data = collect(Path(bundle) if bundle is not None else None, store=store, device=device)
    if html is not None:
        write_html(data, Path(html))
    return data


# --------------------------------------------------------------------------------------------- optimize


def optimize(source: PathLike, *, out: PathLike, load_time: bool = False, device_python: str | None = None,
             repeats: int = 5, **techniques: Any) -> Any:
    """``edgetk optimize``: compress a Keras 3 or PyTorch model (``techniques``: see
    ``toolkit.optimization.optimize``); with ``load_time``, measure a converted artifact's cold-load variants
    instead. Returns a report whose ``to_dict()`` is the ``--json`` document."""
    if load_time:
        given = [k for k, v in techniques.items() if v not in (None, False)]
        if given:
            raise UsageError("--load-time measures a converted artifact; it does not combine with the "
                             f"compression techniques ({', '.join(sorted(given))}).",
                             hint="Run `edgetk optimize` on the source first, convert it, then --load-time on "
                                  "the artifact.")
        from toolkit.optimization.load_time import load_time_report

        return load_time_report(str(source), out_dir=out, python=device_python, repeats=repeats)
    from toolkit.optimization import optimize as do_optimize

    return do_optimize(str(source), out=out, **techniques)


# --------------------------------------------------------------------------------------------- run, quickstart


@with_option_keywords(ConvertOptions, DeviceOptions, CheckOptions)
def run(
    source: PathLike,
    *,
    deploy_force: bool = False,
    break_lock: bool = False,
    progress: Progress | None = None,
    progress_stream: TextSink | None = sys.stderr,
    config: Mapping[str, Any] | None = None,
    **options: Any,
) -> RunResult:
    """``edgetk run``: convert -> deploy -> check, stopping at the first stage that fails.

    ``options`` are :func:`convert`'s keywords (target, calibration, precisions, ...), the device selection
    and the check options. The devices and options are resolved before anything is converted, so a bad spec
    fails fast. ``config`` (the effective options, as ``edgetk run`` records them) is written to the bundle as
    ``run.toml`` so the run can be replayed.
    """
    convert_values, device_values, check_values = split_keywords(
        "run", options, ConvertOptions, DeviceOptions, CheckOptions)
    selection = _select(build(DeviceOptions, device_values))
    checking = build(CheckOptions, check_values)  # refuses bad values before converting
    converted = convert(source, progress=progress, **convert_values)
    if config:
        from toolkit.model.runconfig import write_run_config

        write_run_config(converted.bundle_dir, config)
    names = ", ".join(s.name for s in selection.specs)
    _enter(progress, "deploy", f"deploying {converted.manifest.name} to {names}")
    deployed = _bundle_task(converted.bundle_dir, selection, checking, install=True, check=False,
                            force=deploy_force, progress_stream=progress_stream, break_lock=break_lock)
    if not deployed.passed:
        return RunResult(converted, deployed, None, dict(config or {}))
    _enter(progress, "check", f"checking {converted.manifest.name} on {names}")
    checked = _bundle_task(converted.bundle_dir, selection, checking, install=False, check=True, force=False,
                           progress_stream=None)
    return RunResult(converted, deployed, checked, dict(config or {}))


def quickstart(*, out: PathLike | None = None, store: PathLike | None = None, runs: int = 30,
               progress: Progress | None = None, progress_stream: TextSink | None = sys.stderr) -> RunResult:
    """``edgetk quickstart``: the bundled digits example (trained once, cached) converted for this machine's
    profile, deployed to ``local`` and checked there (``toolkit.example`` holds the example itself)."""
    from toolkit import example
    from toolkit.devices.spec import DeviceSpec
    from toolkit.model.targets import host_profile_name

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


class _Null:
    """A text stream that drops what it is given (progress turned off)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None
