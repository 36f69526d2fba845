"""One bundle deployed and/or checked on one device (:class:`BundleJob`, the unit of work that ``edgetk
deploy``/``check`` and ``toolkit.deploy``/``toolkit.check`` hand to the fleet runner), and staged rollouts:
the fleet in waves (Ansible's ``serial`` + ``max_fail_percentage``), stopped after a wave in which MORE than
``--max-failures`` devices failed, the devices this rollout switched rolled back on request (docs/devices.md,
"Staged rollouts"). Every device's outcome is typed: a job's :class:`BundleOutcome`, a rollback's answer.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from toolkit.checks.checking import require_baseline, runner_flags
from toolkit.delivery.bundle import Bundle, read_bundle
from toolkit.devices.fleet import DeviceOutcome, FleetResult
from toolkit.devices.spec import DeviceSpec
from toolkit.errors import UsageError
from toolkit.model.options import CheckOptions
from toolkit.model.policy import GateOptions
from toolkit.model.device_records import CheckReport
from toolkit.model.answers import RollbackAnswer
from toolkit.model.records import JsonDict
from toolkit.model.waves import FailureLimit, WavePlan
from toolkit.store.guard import GuardedStore, StoreStatus

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.checks.selection import Selection
    from toolkit.delivery.deployment import Device
    from toolkit.delivery.push import PushResult

T = TypeVar("T")
W = TypeVar("W")


class TextSink(Protocol):
    """Where progress lines go: a text stream (``sys.stderr``) or anything with ``write`` and ``flush``."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """What a job does with the bundle on each device (the verb's own switches; the check's are CheckOptions)."""

    install: bool
    check: bool
    force: bool = False  # deploy to a device of another arch than the bundle's target
    compress: bool = False  # send files gzip-compressed where that pays
    break_lock: bool = False  # deploy --break-lock
    prune: bool = False  # deploy --prune: old versions go when the disk is short
    pin: str | None = None  # check --select FILE: the artifact every device runs (toolkit.checks.selection)


@dataclass(frozen=True)
class BundleOutcome:
    """What a job did on one device: the push (None when it only checked), the check reports (none when it only
    deployed) and the artifact the device selected by them (None unless it checked)."""

    push: PushResult | None = None
    reports: tuple[CheckReport, ...] = ()
    selected: Selection | None = None

    @property
    def gate_failed(self) -> bool:
        """A check report failed its gates, or nothing passed there so the device selected nothing."""
        return (any(not r.gates.passed for r in self.reports)
                or (self.selected is not None and self.selected.artifact is None))


@dataclass(frozen=True)
class BundleJob:
    """What to do with ``bundle`` on each device: install it (``options.install``), then check it
    (``options.check``) as ``checking`` says, gated by ``gates`` and recorded in ``store``."""

    bundle: Bundle
    options: JobOptions
    checking: CheckOptions
    gates: GateOptions
    store: GuardedStore | None
    # devices this job switched to the bundle's version -> the version they ran before (for a rollback)
    switched: dict[str, str | None] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def run(self, device: Device, *, progress_stream: TextSink | None) -> BundleOutcome:
        """The job on one connected device: install, then check and select, as its options say."""
        from toolkit.checks.selection import apply as select

        pushed = self._install(device, progress_stream) if self.options.install else None
        if not self.options.check:
            return BundleOutcome(pushed)
        reports = self._check(device)
        if pushed is not None:
            pushed = self._note_replaced(device, pushed, progress_stream)
        selected = select(device, self.bundle, reports, pin=self.options.pin, store=self.store)
        return BundleOutcome(pushed, tuple(reports), selected)

    def _install(self, device: Device, progress_stream: TextSink | None) -> PushResult:
        from toolkit.delivery.pte_lock import refuse_other_release
        from toolkit.delivery.push import push

        for warning in refuse_other_release(device, self.bundle):  # the version lock, before anything is sent
            print(f"warning: {warning}", file=progress_stream or sys.stderr, flush=True)
        what = self.options
        # push's stream is typed TextIO but it only writes and flushes: a TextSink is what it uses.
        pushed = push(device, self.bundle, force=what.force, progress_stream=progress_stream,  # type: ignore[arg-type]
                      compress=what.compress, break_lock=what.break_lock, prune=what.prune)
        if pushed.previous != pushed.version:
            with self._lock:
                self.switched[device.spec.name] = pushed.previous
        return pushed

    def _check(self, device: Device) -> list[CheckReport]:
        from toolkit.checks.checking import check as run_check

        how = self.checking
        flags = runner_flags(profile=how.profile, throughput=how.throughput, loads=how.loads)
        return list(run_check(device, self.bundle, runs=how.runs, warmup=how.warmup, gates=self.gates,
                              store=self.store, runner_args=flags, evaluate=how.evaluate))

    def _note_replaced(self, device: Device, pushed: PushResult, progress_stream: TextSink | None) -> PushResult:
        """Another controller may have deployed while this one checked: say so, on the stream and in the result."""
        from dataclasses import replace

        from toolkit.delivery.locks import replaced_note

        note = replaced_note(device, self.bundle.name, pushed.version)
        if not note:
            return pushed
        print(f"warning: {note}", file=progress_stream or sys.stderr, flush=True)
        return replace(pushed, warnings=(*pushed.warnings, note))

    def store_status(self) -> StoreStatus | None:
        """Where the check reports went (None when the job checks nothing)."""
        return self.store.status() if self.store is not None else None


def prepare_job(bundle_path: str | Path, options: JobOptions, checking: CheckOptions) -> BundleJob:
    """Read and validate the bundle and the gate options once, before any device is contacted; open the history
    (migrating it if needed). A history that is down does not stop the job: its status says so afterwards."""
    from toolkit.delivery.deployment import validate_name

    bundle = read_bundle(Path(bundle_path))
    validate_name(bundle.name)
    files = [a.file for a in bundle.manifest.artifacts]
    if options.pin is not None and options.pin not in files:
        raise UsageError(f"--select {options.pin}: the bundle {bundle.name!r} has no artifact of that name.",
                         hint=f"Pick one of: {', '.join(files)}.")
    if checking.evaluate and options.check:
        from toolkit.checks.device_eval import require_eval_set

        require_eval_set(bundle)
    history = GuardedStore(checking.store, fallback=checking.store_fallback) if options.check else None
    if history is not None and history.probe():
        require_baseline(history, checking.baseline)
    gates = GateOptions(budget_ms=checking.budget_ms, baseline=checking.baseline,
                        regression_pct=checking.regression_pct)
    return BundleJob(bundle=bundle, options=options, checking=checking, gates=gates, store=history)


# ------------------------------------------------------------------------------------------ staged rollouts


@dataclass(frozen=True)
class WaveResult:
    index: int  # 1-based
    devices: tuple[str, ...]
    failed: tuple[str, ...]

    def to_dict(self) -> JsonDict:
        return {"wave": self.index, "devices": list(self.devices), "failed": list(self.failed),
                "failed_pct": round(100.0 * len(self.failed) / len(self.devices), 1) if self.devices else 0.0}


@dataclass(frozen=True)
class RolloutResult(Generic[T]):
    """Every wave that ran, the outcomes of every device that had its turn (in fleet order), why it stopped,
    the devices never reached and what the rollback did."""

    waves: tuple[WaveResult, ...]
    outcomes: tuple[DeviceOutcome[T], ...]
    stopped: str | None  # why the rollout stopped early (None: every wave ran)
    not_started: tuple[str, ...]
    rolled_back: tuple[DeviceOutcome[RollbackAnswer], ...] = ()  # the deployment helper's answer per device

    def to_dict(self) -> JsonDict:
        return {
            "waves": [w.to_dict() for w in self.waves], "stopped": self.stopped, "not_started": list(self.not_started),
            "rolled_back": [{"device": o.device, "ok": o.ok, "error": o.error} for o in self.rolled_back],
        }


def staged_rollout(
    specs: Sequence[DeviceSpec],
    run: Callable[[Sequence[DeviceSpec]], FleetResult[T]],
    *,
    plan: WavePlan,
    max_failures: FailureLimit,
    rollback: Callable[[Sequence[DeviceSpec]], FleetResult[RollbackAnswer]] | None = None,
    switched: Callable[[], Sequence[str]] = lambda: (),
    failed: Callable[[DeviceOutcome[T]], bool] = lambda o: not o.ok,
) -> RolloutResult[T]:
    """Run ``run`` on the fleet wave by wave; stop after a wave that exceeds ``max_failures``; then, with
    ``rollback``, hand it the devices that ``switched()`` names (those the rollout switched to the new version)."""
    waves: list[WaveResult] = []
    outcomes: list[DeviceOutcome[T]] = []
    start, stopped = 0, None
    for index, size in enumerate(plan.batches(len(specs)), start=1):
        batch = specs[start:start + size]
        start += size
        result = run(batch)
        outcomes.extend(result.outcomes)
        bad = tuple(o.device for o in result.outcomes if failed(o))
        waves.append(WaveResult(index, tuple(s.name for s in batch), bad))
        if max_failures.exceeded(len(bad), len(batch)):
            stopped = (f"wave {index}: {len(bad)} of {len(batch)} devices failed "
                       f"({100.0 * len(bad) / len(batch):.0f}%), more than --max-failures {max_failures}")
            break
    not_started = tuple(s.name for s in specs[start:]) if stopped else ()
    rolled: tuple[DeviceOutcome[RollbackAnswer], ...] = ()
    if stopped and rollback is not None:
        names = set(switched())
        back = [s for s in specs if s.name in names]
        if back:
            rolled = rollback(back).outcomes
    return RolloutResult(tuple(waves), tuple(outcomes), stopped, not_started, rolled)


def _check_failed(outcome: DeviceOutcome[BundleOutcome]) -> bool:
    return not outcome.ok or outcome.value is None or outcome.value.gate_failed


class RunOn(Protocol):
    """Runs ``task(Device, spec)`` on each device of a batch (a wave): ``DeviceSelection.run_batch``."""

    def __call__(self, batch: Sequence[DeviceSpec], task: Callable[[Device, DeviceSpec], W], /) -> FleetResult[W]: ...


def deploy_in_waves(
    job: BundleJob,
    specs: Sequence[DeviceSpec],
    *,
    run_on: RunOn,
    plan: WavePlan,
    max_failures: FailureLimit,
    rollback_on_failure: bool,
    progress_stream: TextSink | None = None,
) -> RolloutResult[BundleOutcome]:
    """``edgetk deploy --waves``: ``job`` on the fleet wave by wave through ``run_on`` (``task(Device, spec)`` on
    each device of a wave: ``toolkit.api.fleet.DeviceSelection.run_batch``); a device fails a wave when its deploy
    or its check (gates included) fails."""
    from toolkit.delivery.deployment import rollback as switch_back

    def back(device: Device, spec: DeviceSpec) -> RollbackAnswer:
        if job.switched.get(spec.name) is None:
            raise UsageError(f"{spec.name}: {job.bundle.name} had no earlier version there to go back to.",
                             hint=f"Remove it if needed: edgetk remove {job.bundle.name} --device ...")
        return switch_back(device, job.bundle.name)

    return staged_rollout(
        specs, lambda batch: run_on(batch, lambda device, spec: job.run(device, progress_stream=progress_stream)),
        plan=plan, max_failures=max_failures,
        rollback=(lambda devices: run_on(devices, back)) if rollback_on_failure else None,
        switched=lambda: list(job.switched), failed=_check_failed,
    )
