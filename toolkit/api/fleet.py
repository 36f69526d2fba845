"""The verbs on devices: ``deploy``, ``check``, ``rollback``, ``status``, ``remove``, ``prune``, ``probe``,
``setup`` and ``add_key``; each resolves the device selection once and runs its task on the fleet."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, Unpack

from toolkit.api.keywords import DeployKeywords, DeviceKeywords, FleetCheckKeywords, ReachKeywords
from toolkit.api.results import DeviceLike, DeviceResult, FleetReport, PathLike, Progress
from toolkit.errors import UsageError
from toolkit.model.answers import (
    AddKeyAnswer,
    DeviceAnswer,
    ProbeAnswer,
    PruneAnswer,
    RemoveAnswer,
    RollbackAnswer,
    SetupAnswer,
    StatusAnswer,
)
from toolkit.model.options import (
    CheckOptions,
    DeviceOptions,
    RolloutOptions,
    build,
    split_keywords,
    with_option_keywords,
)

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.api.rollout import BundleOutcome, TextSink
    from toolkit.delivery.deployment import Device
    from toolkit.devices.spec import DeviceSpec
    from toolkit.devices.fleet import DeviceOutcome, FleetResult

W = TypeVar("W")
A = TypeVar("A", bound=DeviceAnswer)


@dataclass(frozen=True)
class DeviceSelection:
    specs: tuple[DeviceSpec, ...]
    options: DeviceOptions

    def run(self, task: Callable[[Device, DeviceSpec], W]) -> FleetResult[W]:
        """``task(device, spec)`` on every device (connection opened and closed around it), concurrently; the
        outcomes in the order of ``specs``."""
        from toolkit.devices import open_connection
        from toolkit.devices.fleet import run_fleet

        known_hosts = str(self.options.known_hosts) if self.options.known_hosts else None

        def one(spec: DeviceSpec) -> W:
            from toolkit.delivery.deployment import Device

            with open_connection(
                spec, trust_new_host=self.options.trust_new_host, known_hosts=known_hosts or spec.known_hosts
            ) as conn:
                return task(Device(spec, conn), spec)

        return run_fleet(self.specs, one, parallel=self.options.parallel)

    def run_batch(self, batch: Sequence[DeviceSpec], task: Callable[[Device, DeviceSpec], W]) -> FleetResult[W]:
        """``task`` on ``batch`` (some of these devices: a wave) as :meth:`run` does, with this selection's
        options: the ``run_on`` of :func:`toolkit.api.rollout.deploy_in_waves`."""
        return DeviceSelection(tuple(batch), self.options).run(task)


@with_option_keywords(DeviceOptions)
def select_devices(devices: Iterable[DeviceLike] | DeviceLike = (), **options: Unpack[ReachKeywords]
                   ) -> DeviceSelection:
    """The devices named by specs (``local``, ``user@host[:port]``, aliases, inventory names) or an inventory."""
    (device_values,) = split_keywords("select_devices", {"devices": devices, **options}, DeviceOptions)
    return selection_of(build(DeviceOptions, device_values))


def selection_of(options: DeviceOptions) -> DeviceSelection:
    from toolkit.devices.inventory import resolve_specs
    from toolkit.devices.spec import DeviceSpec

    given: object = options.devices  # a spec string or DeviceSpec, or several (build() makes them a tuple)
    if isinstance(given, (str, DeviceSpec)) or not isinstance(given, Iterable):
        given = (given,)
    specs = resolve_specs(
        [d if isinstance(d, DeviceSpec) else str(d) for d in given],
        inventory=Path(options.inventory) if options.inventory else None,
        group=options.group,
        limit=options.limit,
    )
    if options.device_home is not None:  # --device-home: over the inventory's `home` of every device named
        from dataclasses import replace

        from toolkit.devices.spec import device_home

        device_home(options.device_home, where="--device-home")
        specs = tuple(replace(spec, home=options.device_home) for spec in specs)
    return DeviceSelection(specs, options)


def _bundle_result(outcome: DeviceOutcome[BundleOutcome], *, gated: bool) -> DeviceResult[None]:
    """A deploy/check outcome -> DeviceResult; a failed gate (or nothing selected) makes the device not ok with
    exit code 1."""
    from toolkit.api.rollout import BundleOutcome

    value = outcome.value if outcome.value is not None else BundleOutcome()
    failed = [r for r in value.reports if not r.gates.passed] if gated else []
    selected = value.selected
    nothing = gated and selected is not None and selected.artifact is None  # nothing passes: exit 1, say why
    code = outcome.exit_code or (1 if failed or nothing else 0)
    error = outcome.error
    if error is None and (failed or nothing):
        error = "; ".join([failure for r in failed for failure in r.gates.failures]
                          + ([f"nothing selected: {selected.reason}"] if nothing and selected else []))
    return DeviceResult(outcome.device, code == 0, error, code, push=value.push, reports=value.reports,
                        selected=selected)


def _answered(outcome: DeviceOutcome[A]) -> DeviceResult[A]:
    """A rollback/status/remove/prune/probe/setup/add-key outcome -> DeviceResult: its typed ``answer``."""
    code = outcome.exit_code
    return DeviceResult(outcome.device, code == 0, outcome.error, code, answer=outcome.value)


def _answers(outcomes: Iterable[DeviceOutcome[A]]) -> FleetReport[A]:
    return FleetReport(tuple(_answered(o) for o in outcomes))


def bundle_task(
    bundle_path: PathLike,
    selection: DeviceSelection,
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
) -> FleetReport[None]:
    from toolkit.api.rollout import JobOptions, prepare_job

    what = JobOptions(install=install, check=check, force=force, compress=compress, break_lock=break_lock,
                      prune=prune, pin=pin)
    job = prepare_job(bundle_path, what, checking)
    stream = progress_stream if progress_stream is not None else _Null()
    if rollout is not None and rollout.waves:
        from toolkit.api.rollout import deploy_in_waves
        from toolkit.model.waves import FailureLimit, WavePlan

        staged = deploy_in_waves(job, selection.specs, run_on=selection.run_batch, plan=WavePlan.parse(rollout.waves),
                                 max_failures=FailureLimit.parse(rollout.max_failures),
                                 rollback_on_failure=rollout.rollback_on_failure, progress_stream=stream)
        results = tuple(_bundle_result(o, gated=check) for o in staged.outcomes)
        return FleetReport(results, store=job.store_status(), rollout=staged)
    outcomes = selection.run(lambda device, spec: job.run(device, progress_stream=stream)).outcomes
    return FleetReport(tuple(_bundle_result(o, gated=check) for o in outcomes), store=job.store_status())


@with_option_keywords(DeviceOptions, CheckOptions, RolloutOptions)
def deploy(bundle: PathLike, *, check: bool = False, force: bool = False, compress: bool = False,
           break_lock: bool = False, prune: bool = False, progress_stream: TextSink | None = sys.stderr,
           **options: Unpack[DeployKeywords]) -> FleetReport[None]:
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
    selection = selection_of(build(DeviceOptions, device_values))
    return bundle_task(bundle, selection, checking, install=True, check=check, force=force, compress=compress,
                        progress_stream=progress_stream, rollout=rollout, break_lock=break_lock, prune=prune)


@with_option_keywords(DeviceOptions, CheckOptions)
def check(bundle: PathLike, *, select: str | None = None, progress_stream: TextSink | None = None,
          **options: Unpack[FleetCheckKeywords]) -> FleetReport[None]:
    """``edgetk check``: run the deployed bundle on every device, gate the reports, record them in the store;
    each device then selects the artifact it runs (toolkit.checks.selection); ``select=FILE`` pins that one."""
    device_values, check_values = split_keywords("check", options, DeviceOptions, CheckOptions)
    checking = build(CheckOptions, check_values)
    selection = selection_of(build(DeviceOptions, device_values))
    return bundle_task(bundle, selection, checking, install=False, check=True, force=False,
                        progress_stream=progress_stream, pin=select)


def _simple(caller: str, options: DeviceKeywords, action: Callable[[Device], A]) -> FleetReport[A]:
    """``action`` on every selected device; its answer is each device's ``answer``."""
    (device_values,) = split_keywords(caller, options, DeviceOptions)
    selection = selection_of(build(DeviceOptions, device_values))
    return _answers(selection.run(lambda device, spec: action(device)).outcomes)


@with_option_keywords(DeviceOptions)
def rollback(name: str, *, break_lock: bool = False, **options: Unpack[DeviceKeywords]
             ) -> FleetReport[RollbackAnswer]:
    """``edgetk rollback``: bundle ``name``'s ``current`` back to the previous version on every device."""
    from toolkit.delivery.deployment import rollback as do_rollback

    return _simple("rollback", options, lambda device: do_rollback(device, name, break_lock=break_lock))


@with_option_keywords(DeviceOptions)
def status(**options: Unpack[DeviceKeywords]) -> FleetReport[StatusAnswer]:
    """``edgetk status``: the bundles and versions installed on every device (``answer.bundles``)."""
    from toolkit.delivery.deployment import status as do_status

    return _simple("status", options, do_status)


@with_option_keywords(DeviceOptions)
def remove(name: str, *, break_lock: bool = False, **options: Unpack[DeviceKeywords]) -> FleetReport[RemoveAnswer]:
    """``edgetk remove``: delete bundle ``name`` (every version) from every device."""
    from toolkit.delivery.deployment import remove as do_remove

    return _simple("remove", options, lambda device: do_remove(device, name, break_lock=break_lock))


@with_option_keywords(DeviceOptions)
def prune(name: str, *, keep: int = 2, break_lock: bool = False, **options: Unpack[DeviceKeywords]
          ) -> FleetReport[PruneAnswer]:
    """``edgetk prune``: remove old versions of bundle ``name`` on every device, keeping the current version and
    the ``keep - 1`` installed before it, always the rollback target (``answer``: removed, kept, freed_bytes)."""
    from toolkit.delivery.deployment import prune as do_prune

    if keep < 1:
        raise UsageError(f"--keep must be at least 1, got {keep}.", hint="The current version is always kept.")
    return _simple("prune", options, lambda device: do_prune(device, name, keep=keep, break_lock=break_lock))


@with_option_keywords(DeviceOptions)
def probe(**options: Unpack[DeviceKeywords]) -> FleetReport[ProbeAnswer]:
    """``edgetk devices probe``: arch, OS, CPU, memory, runtimes and best profile (``answer.probe``)."""
    from toolkit.devices.probe import probe_device

    return _simple("probe", options, lambda device: ProbeAnswer(probe=probe_device(device)))


@with_option_keywords(DeviceOptions)
def setup(*, runtimes: Sequence[str] = (), offline: bool = False, venv: str | None = None,
          target: str | None = None, progress: Progress | None = None, **options: Unpack[DeviceKeywords]
          ) -> FleetReport[SetupAnswer]:
    """``edgetk devices setup``: a venv on every device with numpy and its runtimes (``answer.setup``).

    ``runtimes`` default to the ones the device's target profile runs; ``offline`` downloads wheels here
    and pushes them; ``venv`` is where the venv goes (default ``<home>/venv``, ``~/.edgetk/venv`` unless the
    device sets its ``home``); ``target`` names the
    profile whose runtime versions to install; ``progress`` gets ``"DEVICE: line"`` messages.
    """
    from toolkit.delivery.provisioning import SetupOptions, setup_device

    (device_values,) = split_keywords("setup", options, DeviceOptions)
    selection = selection_of(build(DeviceOptions, device_values))
    if target:
        from toolkit.model.targets import get_profile

        get_profile(target)  # an unknown name is a usage error before any device is touched
    wanted = SetupOptions(runtimes=tuple(runtimes), offline=offline, venv=_venv_path(venv) if venv else None,
                          target=target)

    def task(device: Device, spec: DeviceSpec) -> SetupAnswer:
        def log(line: str) -> None:
            if progress is not None:
                progress(f"{spec.name}: {line}")

        return SetupAnswer(setup=setup_device(device, wanted, log=log))

    return _answers(selection.run(task).outcomes)


@with_option_keywords(DeviceOptions)
def add_key(*, public_key: PathLike | None = None, password_file: PathLike | None = None,
            password_env: str | None = None, ask: Callable[[], str] | None = None, **options: Unpack[DeviceKeywords]
            ) -> FleetReport[AddKeyAnswer]:
    """``edgetk devices add-key``: install the user's public key on every device over a password login, then prove
    a key login works; host keys are checked and recorded as ``devices probe --trust-new-host`` does.

    ``public_key``: the .pub file (default: the device's IdentityFile, else ~/.ssh/id_*.pub). The password, one
    for the whole fleet, comes from ``password_file`` (its first line), else the environment variable named
    ``password_env``, else ``ask()`` (a terminal prompt); it is never logged or stored (``answer.add_key``).
    """
    from toolkit.devices.first_boot import add_keys

    (device_values,) = split_keywords("add_key", options, DeviceOptions)
    chosen = build(DeviceOptions, device_values)
    specs = selection_of(chosen).specs
    outcomes = add_keys(specs, public_key=public_key, password_file=password_file, password_env=password_env,
                        ask=ask, trust_new_host=chosen.trust_new_host, known_hosts=chosen.known_hosts,
                        parallel=chosen.parallel)
    return _answers(outcomes)


def _venv_path(text: str) -> str:
    """``~/x`` and relative paths are relative to the device user's home (the remote working directory)."""
    text = text.strip()
    if not text or "\x00" in text:
        raise UsageError("--venv needs a path.", hint="For example --venv ~/.edgetk/venv-legacy.")
    if text == "~":
        raise UsageError("--venv ~ would turn the home directory into a venv.", hint="Name a directory below it.")
    return text.removeprefix("~/")


class _Null:
    """A text stream that drops what it is given (progress turned off)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None
