"""Check a deployed bundle ON the device: run its runner, parse the JSON, gate, record in the history.

Gates (each failure is one reason; the check fails when any reason remains):

- the artifact ran (a runner error such as ``missing_runtime`` is a failure with the runner's hint);
- outputs match the golden outputs (the runner's ``outputs_match.ok``);
- **budget**: p90 <= ``budget_ms``, else the manifest's target profile ``latency_budget_ms``; without either
  the gate is skipped and the skip is listed as a ``skipped:`` note (it does not fail the check);
- **regression**: p50 no more than ``regression_pct`` percent above the baseline's p50. The median is used here
  (not p90) because it is the stable statistic; a noisy tail would make this gate flap. Baseline ``last`` = the
  newest passing check of the same bundle name, device and artifact in the store; ``none``; or a CHECK_ID (a
  report id, or a run id whose report for the same artifact is used).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.bundle import Bundle
from toolkit.deployment import Device, installed_version, version_dir
from toolkit.errors import DeviceError, UsageError
from toolkit.store import Store, StoredCheck
from toolkit.types import CheckReport, GateResult, LatencyStats

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class GateOptions:
    budget_ms: float | None = None
    baseline: str = "last"  # "last" | "none" | CHECK_ID
    regression_pct: float = 10.0

    def __post_init__(self) -> None:
        if self.budget_ms is not None and self.budget_ms <= 0:
            raise UsageError(f"--budget-ms must be positive, got {self.budget_ms}.")
        if self.regression_pct < 0:
            raise UsageError(f"--regression-pct must be 0 or more, got {self.regression_pct}.")
        if not self.baseline:
            raise UsageError("--baseline needs a value: last, none or a CHECK_ID.")


def profile_budget(target: str | None) -> tuple[float | None, str | None]:
    """The target profile's latency budget, or (None, why not)."""
    if not target:
        return None, "the bundle names no target profile"
    try:
        from toolkit.targets import get_profile
    except ImportError:
        return None, "target profiles are not available in this install"
    try:
        budget = getattr(get_profile(target), "latency_budget_ms", None)
    except Exception as exc:  # an unknown or broken profile must not stop a check; say so instead
        return None, f"the target profile {target!r} could not be read ({getattr(exc, 'message', exc)})"
    if budget is None:
        return None, f"the target profile {target!r} sets no latency budget"
    return float(budget), None


def _latency(data: Mapping[str, Any] | None) -> LatencyStats | None:
    if not data:
        return None
    try:
        return LatencyStats(**{k: float(data[k]) for k in ("mean", "std", "min", "p50", "p90", "p99", "max")})
    except (KeyError, TypeError, ValueError):
        return None


def parse_runner_output(stdout: str, *, device: str, artifacts: Sequence[str]) -> list[CheckReport]:
    """The runner's JSON -> ungated CheckReports (a top-level error becomes one failed report per artifact)."""
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise DeviceError(f"{device}: the runner printed no JSON report.", hint="Run it by hand with --debug.")
    environment = doc.get("environment") or {}
    reports = []
    for item in doc.get("reports") or []:
        runtime = item.get("runtime") or {}
        reports.append(
            CheckReport(
                device=device,
                artifact=str(item.get("artifact")),
                runtime={"name": runtime.get("name"), "version": runtime.get("version")},
                threads=item.get("threads"),
                load_ms=item.get("load_ms"),
                first_inference_ms=item.get("first_inference_ms"),
                latency_ms=_latency(item.get("latency_ms")),
                runs=int(item.get("runs") or 0),
                warmup=int(item.get("warmup") or 0),
                peak_rss_mb=item.get("peak_rss_mb"),
                outputs_match=item.get("outputs_match"),
                environment=environment,
                gates=GateResult(True),
                error=item.get("error"),
            )
        )
    top_error = doc.get("error")
    if top_error:
        seen = {r.artifact for r in reports}
        for artifact in artifacts:
            if artifact not in seen:
                reports.append(
                    CheckReport(
                        device=device, artifact=artifact, runtime={"name": None, "version": None}, threads=None,
                        load_ms=None, first_inference_ms=None, latency_ms=None, runs=0, warmup=0,
                        peak_rss_mb=None, outputs_match=None, environment=environment, gates=GateResult(True),
                        error=top_error,
                    )
                )
    if not reports:
        raise DeviceError(f"{device}: the runner reported no artifacts.", hint="Is the bundle empty?")
    return reports


def gate(
    report: CheckReport,
    *,
    budget_ms: float | None,
    budget_source: str,
    budget_skip: str | None,
    baseline: StoredCheck | None,
    regression_pct: float,
) -> GateResult:
    reasons: list[str] = []
    notes: list[str] = []
    name = report.artifact
    if report.error:
        err = report.error
        hint = f" ({err.get('hint')})" if err.get("hint") else ""
        reasons.append(f"{name}: could not run: {err.get('kind')}: {err.get('message')}{hint}")
        return GateResult(False, tuple(reasons))
    match = report.outputs_match or {}
    if not match.get("ok"):
        reasons.append(
            f"{name}: outputs differ from the golden outputs (max abs error {match.get('max_abs_error')}, "
            f"top-1 agreement {match.get('top1_agreement')})"
        )
    lat = report.latency_ms
    if lat is None:
        reasons.append(f"{name}: no latency was measured")
    else:
        if budget_ms is not None:
            if lat.p90 > budget_ms:
                reasons.append(f"{name}: p90 {lat.p90:.3f} ms exceeds the budget of {budget_ms:g} ms ({budget_source})")
        else:
            notes.append(f"skipped: latency budget gate ({budget_skip})")
        if baseline is not None and baseline.p50_ms:
            limit = baseline.p50_ms * (1 + regression_pct / 100.0)
            if lat.p50 > limit:
                slower = 100.0 * (lat.p50 - baseline.p50_ms) / baseline.p50_ms
                reasons.append(
                    f"{name}: p50 {lat.p50:.3f} ms is {slower:.1f}% slower than baseline {baseline.check_id} "
                    f"({baseline.p50_ms:.3f} ms); allowed: {regression_pct:g}%"
                )
    return GateResult(not reasons, tuple(reasons + notes))


def _baseline(store: Store | None, option: str, *, bundle: str, device: str, artifact: str) -> StoredCheck | None:
    if store is None or option == "none":
        return None
    if option == "last":
        return store.last_passing(bundle=bundle, device=device, artifact=artifact)
    found = store.by_id(option, artifact=artifact)
    if found is None:
        raise UsageError(
            f"No stored check {option!r} for {artifact}.",
            hint="Use --baseline last, none, or an id from `edgetk history`.",
        )
    return found


def check(
    device: Device,
    bundle: Bundle,
    *,
    runs: int = 50,
    warmup: int = 5,
    gates: GateOptions | None = None,
    store: Store | None = None,
    timeout: float = CHECK_TIMEOUT_S,
) -> list[CheckReport]:
    """Run every artifact of ``bundle`` (which must be installed on the device), gate, store; return reports."""
    gates = gates or GateOptions()
    if runs < 1 or warmup < 0:
        raise UsageError(f"--runs must be at least 1 and --warmup at least 0 (got {runs} and {warmup}).")
    if store is not None and gates.baseline not in ("last", "none") and not store.exists(gates.baseline):
        raise UsageError(
            f"No stored check {gates.baseline!r} in {store.path}.",
            hint="Use --baseline last, none, or an id from `edgetk history`.",
        )
    name = bundle.name
    installed = installed_version(device, name)
    vdir = version_dir(name, bundle.version)
    if installed is None or not device.conn.exists(f"{vdir}/manifest.json"):
        raise UsageError(
            f"{device.spec.name}: version {bundle.version[:12]} of {name!r} is not installed there.",
            hint="Deploy it first: edgetk deploy BUNDLE --device ... (or deploy --check).",
        )
    runner = bundle.manifest.runner.file if bundle.manifest.runner else "edgetk_runner.py"
    argv = [device.python, f"{vdir}/{runner}", "check", "--bundle", vdir, "--runs", str(runs), "--warmup", str(warmup)]
    result = device.conn.run(argv, timeout=timeout)
    artifacts = [a.file for a in bundle.manifest.artifacts]
    if not result.stdout.strip():
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise DeviceError(
            f"{device.spec.name}: the runner failed with exit code {result.returncode} and no report ({tail}).",
            hint=f"Is {device.python!r} a working Python on the device? Set `python` in the inventory.",
        )
    reports = parse_runner_output(result.stdout, device=device.spec.name, artifacts=artifacts)
    budget: float | None
    skip: str | None
    if gates.budget_ms is not None:
        budget, source, skip = gates.budget_ms, "--budget-ms", None
    else:
        target = bundle.manifest.target or device.spec.target
        budget, skip = profile_budget(target)
        source = f"target {target}"
    gated = []
    for report in reports:
        base = _baseline(store, gates.baseline, bundle=name, device=device.spec.name, artifact=report.artifact)
        result_gate = gate(
            report, budget_ms=budget, budget_source=source, budget_skip=skip, baseline=base,
            regression_pct=gates.regression_pct,
        )
        gated.append(_with(report, gates=result_gate))
    if store is not None:
        run_id = store.new_run_id()
        ids = store.record(gated, bundle=name, version=bundle.version, run_id=run_id)
        gated = [_with(r, check_id=i) for r, i in zip(gated, ids)]
    return gated


def _with(report: CheckReport, **changes: Any) -> CheckReport:
    from dataclasses import replace

    return replace(report, **changes)
