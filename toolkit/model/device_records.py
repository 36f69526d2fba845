"""What a device returns: a command's result, and an artifact measured there and gated (the check report)."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.model.records import JsonDict, JsonObject, Record


@dataclass(frozen=True)
class CommandResult:
    """What a command run on a device returned. ``signal``: the signal that killed it (``SIGKILL``), None when it
    exited (``returncode`` is then its exit code; after a signal it is negative or SSH's -1)."""

    returncode: int
    stdout: str
    stderr: str
    signal: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.signal is None


@dataclass(frozen=True)
class LatencyStats(Record):
    mean: float
    std: float
    min: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True)
class GateResult:
    """The verdict of a check's gates: ``failures`` (each one line naming the artifact and the fix) fail it;
    ``skipped`` notes say which gate could not run and why (no budget, too few baseline checks) and do not.
    ``details`` carries what the gates computed (``regression``: the statistics; ``placement``) for reports.
    """

    passed: bool
    failures: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    details: JsonObject = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.passed == bool(self.failures):
            raise ValueError("GateResult: passed must be True exactly when there are no failures")

    @property
    def reasons(self) -> tuple[str, ...]:
        """The failures (the check report's ``gates.reasons`` key, kept for the JSON contract)."""
        return self.failures

    def to_dict(self) -> JsonDict:
        return {"passed": self.passed, "reasons": list(self.failures), "skipped": list(self.skipped),
                "details": dict(self.details)}


@dataclass(frozen=True)
class CheckReport:
    """One artifact measured on one device by the runner, then gated (architecture.md's check report)."""

    device: str
    artifact: str
    runtime: JsonObject  # {"name", "version"}
    threads: int | None
    load_ms: float | None
    first_inference_ms: float | None
    latency_ms: LatencyStats | None
    runs: int
    warmup: int
    peak_rss_mb: float | None
    outputs_match: JsonObject | None  # {"max_abs_error", "top1_agreement", "ok"}
    environment: JsonObject
    gates: GateResult
    error: JsonObject | None = None  # {"kind", "message", "hint"} when the runner could not measure
    check_id: str | None = None
    latency_samples_ms: tuple[float, ...] = ()  # every timed run, kept in the history for regression tests
    placement: JsonObject | None = None  # where the nodes ran (the runner's ``placement``), when reported
    # measured on request (check --profile / --throughput / --loads; docs/runner.md has their shapes)
    profile: JsonObject | None = None  # per-operator times per op type and top nodes, profiler overhead
    throughput: JsonObject | None = None  # the latency-throughput curve (batch sizes or requests in flight)
    loads: JsonObject | None = None  # cold / warm loads with the first inference, load options before/after
    throttled: str | None = None  # why the device was throttling during the run (toolkit.checks.selection.throttled)
    # check --eval: the eval set on the device, scored against the labels and the float model (toolkit.checks.device_eval)
    evaluation: JsonObject | None = None
    bundled_check: JsonObject | None = None  # a .pte's bundled program run on the device (docs/runner.md)
    worker: JsonObject | None = None  # .pte: measured in a process forked after one shared import (runner.md)

    def to_dict(self) -> JsonDict:
        return {
            "check_id": self.check_id,
            "device": self.device,
            "artifact": self.artifact,
            "runtime": dict(self.runtime),
            "threads": self.threads,
            "load_ms": self.load_ms,
            "first_inference_ms": self.first_inference_ms,
            "latency_ms": self.latency_ms.to_dict() if self.latency_ms else None,
            "runs": self.runs,
            "warmup": self.warmup,
            "peak_rss_mb": self.peak_rss_mb,
            "outputs_match": dict(self.outputs_match) if self.outputs_match is not None else None,
            "environment": dict(self.environment),
            "gates": self.gates.to_dict(),
            "error": dict(self.error) if self.error is not None else None,
            "placement": dict(self.placement) if self.placement is not None else None,
            "latency_samples_ms": list(self.latency_samples_ms),
            "profile": dict(self.profile) if self.profile is not None else None,
            "throughput": dict(self.throughput) if self.throughput is not None else None,
            "loads": dict(self.loads) if self.loads is not None else None,
            "throttled": self.throttled,
            "evaluation": dict(self.evaluation) if self.evaluation is not None else None,
            "bundled_check": dict(self.bundled_check) if self.bundled_check is not None else None,
            "worker": dict(self.worker) if self.worker is not None else None,
        }
