"""Check a deployed bundle ON the device: run its runner, parse the JSON, gate, record in the history.

Everything check gates on that is not measured comes from the bundle itself: the manifest's ``check_policy``
(:mod:`toolkit.model.policy`, written at convert time from the target profile), never from a profile looked up again
by name, so a bundle built with a user's profile gates the same on every machine. ``--budget-ms`` and
``--regression-pct`` override it. A bundle without a policy (built by an older edgetk) is still checked; the
gates it cannot run are listed as ``skipped`` notes, which never fail a check.

Gates (each failure is one line naming the artifact; the check fails when any remains):

- the artifact ran (a runner error such as ``missing_runtime`` is a failure with the runner's hint);
- outputs match the golden outputs (the runner's ``outputs_match.ok``);
- **budget**: p90 <= ``--budget-ms``, else the policy's ``latency_budget_ms``;
- **regression** (:mod:`toolkit.regression`): the raw latency samples of this check against the pooled samples
  of the last ``baseline_checks`` checks of the same bundle name, device and artifact that were not themselves
  regressions: a one-sided Mann-Whitney U test AND a minimum effect in percent and in ms beyond the slowest of
  those checks. ``--baseline none`` turns it off; ``--baseline CHECK_ID`` compares with that one check;
- **placement**: for each of the policy's placement expectations that applies to the artifact, at least
  ``min_nodes_pct`` percent of its nodes ran on the intended delegate or execution provider; the failure names
  the operators that fell back. An ONNX artifact whose provider the device's onnxruntime lacks has fallen back
  entirely, which is a failure, not a pass.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from toolkit.delivery.bundle import Bundle
from toolkit.delivery.deployment import Device, installed_version, version_dir
from toolkit.errors import DeviceError, ToolkitError, UsageError
from toolkit.model.policy import CheckPolicy, GateOptions, PlacementExpectation, RegressionPolicy
from toolkit.regression import RegressionVerdict, confirmed, decide
from toolkit.checks.selection import throttled
from toolkit.store import Store, StoredCheck
from toolkit.model.device_records import CheckReport, GateResult, LatencyStats

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 900.0
NO_POLICY = ("the bundle carries no check policy (built by an older edgetk): its target's latency budget and "
             "placement expectations are unknown and the regression gate uses the default thresholds; rebuild it "
             "with `edgetk convert`, or pass --budget-ms")


@dataclass(frozen=True)
class Budget:
    """The latency budget in force: ``ms`` with where it came from, or None with why not."""

    ms: float | None
    source: str = ""
    skip: str | None = None


def budget_for(policy: CheckPolicy | None, options: GateOptions) -> Budget:
    if options.budget_ms is not None:
        return Budget(options.budget_ms, "--budget-ms")
    if policy is None:
        return Budget(None)  # the NO_POLICY note says why
    if policy.latency_budget_ms is None:
        return Budget(None, skip=f"latency budget: the target {policy.target or '(none)'} sets none")
    return Budget(policy.latency_budget_ms, f"target {policy.target}" if policy.target else "the bundle's policy")


def regression_policy_for(policy: CheckPolicy | None, options: GateOptions) -> RegressionPolicy:
    base = policy.regression if policy is not None else RegressionPolicy()
    if options.regression_pct is not None:
        return replace(base, min_slowdown_pct=options.regression_pct)
    return base


# --------------------------------------------------------------------------------------------- parsing


def _latency(data: Mapping[str, Any] | None) -> LatencyStats | None:
    if not data:
        return None
    try:
        return LatencyStats(**{k: float(data[k]) for k in ("mean", "std", "min", "p50", "p90", "p99", "max")})
    except (KeyError, TypeError, ValueError):
        return None


def _samples(data: Any) -> tuple[float, ...]:
    if not isinstance(data, list):
        return ()
    try:
        return tuple(float(v) for v in data if v is not None)
    except (TypeError, ValueError):
        return ()


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
        placement = item.get("placement")
        reports.append(
            CheckReport(
                device=device,
                artifact=str(item.get("artifact")),
                runtime={k: v for k, v in runtime.items()} if isinstance(runtime, dict) else {},
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
                throttled=throttled(environment),
                latency_samples_ms=_samples(item.get("latency_samples_ms")),
                placement=placement if isinstance(placement, dict) else None,
                **{key: item.get(key) if isinstance(item.get(key), dict) else None
                   for key in ("profile", "throughput", "loads")},
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


# --------------------------------------------------------------------------------------------- placement


def _same_place(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


def _op_label(entry: Any) -> str:
    if isinstance(entry, Mapping):
        op, name = entry.get("op_type"), entry.get("name")
        label = " ".join(str(p) for p in (op, name) if p)
        return f"{label} (on {entry['on']})" if entry.get("on") else label or "?"
    return str(entry)


def _fallback_text(ops: Any, limit: int = 8) -> str:
    labels = [_op_label(e) for e in ops] if isinstance(ops, list) else []
    if not labels:
        return ""
    shown = ", ".join(labels[:limit])
    return f"; fell back: {shown}" + (f" and {len(labels) - limit} more" if len(labels) > limit else "")


EMULATED_PLACEMENT = ("placement of {name}: not judged on an emulated device (the probe saw an ARM kernel on an x86 "
                      "CPU); check {want} on the real board")


def judge_placement(report: CheckReport, expectation: PlacementExpectation) -> tuple[str | None, str | None,
                                                                                    dict[str, Any]]:
    """(failure, skip note, detail) of one placement expectation for one measured artifact."""
    name, want, floor = report.artifact, expectation.on, expectation.min_nodes_pct
    detail: dict[str, Any] = {"artifact": name, "expected": want, "min_nodes_pct": floor}
    placement = report.placement or {}
    runtime = report.runtime or {}
    missing = [str(p) for p in runtime.get("providers_missing") or []]
    total = placement.get("nodes_total")
    if placement.get("intended") is not None and isinstance(total, int) and total > 0:
        intended = str(placement["intended"])
        on = int(placement.get("nodes_on_intended") or 0)
        share = 100.0 * on / total
        detail.update(intended=intended, nodes_total=total, nodes_on_expected=on if _same_place(intended, want)
                      else None, time_share_on_intended=placement.get("time_share_on_intended"))
        if not _same_place(intended, want):
            return (f"{name}: the target expects its nodes on {want}, but the artifact asks for {intended} "
                    f"(rebuild the bundle for this target)", None, detail)
        if share + 1e-9 < floor:
            why = f" ({want} is not available in this runtime)" if want in missing else ""
            return (f"{name}: {on} of {total} nodes ({share:.0f}%) ran on {want}{why}; the target expects at "
                    f"least {floor:g}%{_fallback_text(placement.get('fallback_ops'))}", None, detail)
        return None, None, detail
    if expectation.format == "onnx":
        used = [str(p) for p in runtime.get("providers") or []]
        detail.update(providers=used, providers_missing=missing)
        if not any(_same_place(p, want) for p in used):
            why = ("this onnxruntime does not have it" if want in missing
                   else "the session was not opened with it")
            return (f"{name}: no node ran on {want} ({why}; the session ran on {', '.join(used) or 'no provider'}), "
                    f"so every node fell back to the CPU; the target expects at least {floor:g}% on {want}",
                    None, detail)
        return None, f"placement of {name}: {want} was used, but the runner reported no per-node placement", detail
    return None, f"placement of {name}: the runner reported no per-node placement to judge {want}", detail


# --------------------------------------------------------------------------------------------- gates


def _regression_text(name: str, verdict: RegressionVerdict, policy: RegressionPolicy, explicit: bool) -> str:
    assert verdict.current_p50_ms is not None and verdict.reference_ms is not None
    against = (f"baseline {verdict.baseline_checks[0]}" if explicit
               else f"the slowest of the last {len(verdict.baseline_checks)} checks")
    return (f"{name}: p50 {verdict.current_p50_ms:.3f} ms is {verdict.ratio:.2f}x {against} "
            f"({verdict.reference_ms:.3f} ms; {verdict.baseline_samples} baseline samples, Mann-Whitney "
            f"p={verdict.p_value:.2g}); a regression is more than +{policy.min_slowdown_pct:g}% and "
            f"+{policy.min_slowdown_ms:g} ms"
            + (f"; a second runner process confirmed it (p50 {verdict.confirm_p50_ms:.3f} ms)"
               if verdict.confirmed else ""))


def gate(
    report: CheckReport,
    *,
    budget: Budget,
    regression: RegressionVerdict | None,
    regression_policy: RegressionPolicy,
    explicit_baseline: bool = False,
    placement: Sequence[PlacementExpectation] = (),
    artifact_format: str | None = None,
    notes: Sequence[str] = (),
    throughput_floor: float | None = None,
) -> GateResult:
    """Gate one measured report. ``regression`` None: no baseline asked for (``--baseline none``)."""
    failures: list[str] = []
    skipped: list[str] = list(notes)
    details: dict[str, Any] = {}
    name = report.artifact
    if report.error:
        err = report.error
        hint = f" ({err.get('hint')})" if err.get("hint") else ""
        return GateResult(False, (f"{name}: could not run: {err.get('kind')}: {err.get('message')}{hint}",),
                          tuple(skipped))
    match = report.outputs_match or {}
    if not match.get("ok"):
        failures.append(
            f"{name}: outputs differ from the golden outputs (max abs error {match.get('max_abs_error')}, "
            f"top-1 agreement {match.get('top1_agreement')})"
        )
    lat = report.latency_ms
    if lat is None:
        failures.append(f"{name}: no latency was measured")
    elif budget.ms is not None:
        if lat.p90 > budget.ms:
            failures.append(f"{name}: p90 {lat.p90:.3f} ms exceeds the budget of {budget.ms:g} ms ({budget.source})")
    elif budget.skip:
        skipped.append(budget.skip)
    if regression is not None:
        details["regression"] = regression.to_dict()
        if regression.regressed:
            failures.append(_regression_text(name, regression, regression_policy, explicit_baseline))
        elif regression.confirmed is False and regression.current_p50_ms is not None:
            skipped.append(f"regression of {name}: not confirmed: p50 {regression.current_p50_ms:.3f} ms was "
                           f"{regression.ratio:.2f}x the baseline, a second runner process measured "
                           f"{regression.confirm_p50_ms:.3f} ms (one slow process, not a slower artifact)")
        elif regression.skip:
            skipped.append(f"regression of {name}: {regression.skip}")
    checked = []
    emulated = bool((report.environment or {}).get("emulated"))
    for expectation in placement:
        if artifact_format is None or not expectation.applies_to(name, artifact_format):
            continue
        failure, skip, detail = judge_placement(report, expectation)
        if emulated:
            # qemu-user runs the ARM build on an x86 host: where its nodes run says nothing of the real board
            # (XNNPACK takes no LiteRT node there), so the measured placement is reported but not judged
            detail["judged"] = False
            skip = EMULATED_PLACEMENT.format(name=name, want=expectation.on) + (f" (here: {failure})" if failure
                                                                                 else "")
            failure = None
        checked.append(detail)
        if failure:
            failures.append(failure)
        if skip:
            skipped.append(skip)
    if checked:
        details["placement"] = checked
    failure, skip = judge_throughput(report, throughput_floor)
    if failure:
        failures.append(failure)
    if skip:
        skipped.append(skip)
    return GateResult(not failures, tuple(failures), tuple(dict.fromkeys(skipped)), details)


def judge_throughput(report: CheckReport, floor: float | None) -> tuple[str | None, str | None]:
    """(failure, skip note) of the throughput gates: batched outputs must equal batch-1 outputs per sample, and
    the best point of the curve must reach the policy's floor (skipped, and said, without --throughput)."""
    name = report.artifact
    curve = report.throughput or {}
    per_sample = curve.get("per_sample") or {}
    if per_sample.get("ok") is False:
        bad = [c for c in per_sample.get("checks") or [] if not c.get("ok")]
        worst = ", ".join(f"batch {c.get('batch')}: max abs error {c.get('max_abs_error')}" for c in bad)
        return (f"{name}: outputs at batch > 1 differ from batch-1 outputs per sample ({worst}; tolerance "
                f"{per_sample.get('tolerance')})", None)
    if floor is None:
        return None, None
    points = [p for p in curve.get("points") or [] if p.get("inferences_per_s")]
    if not points:
        why = curve.get("error") or "run the check with --throughput"
        return None, f"throughput floor of {floor:g}/s for {name}: not measured ({why})"
    best = max(points, key=lambda p: float(p["inferences_per_s"]))
    where = (f"batch {best.get('batch')}" if curve.get("mode") == "batch"
             else f"{best.get('in_flight')} requests in flight")
    if float(best["inferences_per_s"]) < floor:
        return (f"{name}: at most {float(best['inferences_per_s']):.1f} inferences/s ({where}); the target asks "
                f"for at least {floor:g}/s", None)
    return None, None


# --------------------------------------------------------------------------------------------- baselines


def _stored_samples(stored: StoredCheck) -> list[float]:
    return list(_samples(stored.report.get("latency_samples_ms")))


def _was_regression(stored: StoredCheck) -> bool:
    regression = ((stored.report.get("gates") or {}).get("details") or {}).get("regression") or {}
    return regression.get("regressed") is True


def baseline_samples(
    store: Store, *, bundle: str, device: str, artifact: str, checks: int, artifacts: int = 1
) -> list[tuple[str, list[float]]]:
    """[(check_id, samples)] of the newest ``checks`` checks of this bundle name, device and artifact that
    measured something, were not regressions themselves and not taken while the device throttled, oldest
    first."""
    rows = store.history(device=device, bundle=bundle, limit=max(50, 4 * checks * artifacts))
    eligible = [
        (row.check_id, _stored_samples(row))
        for row in rows
        if row.artifact == artifact and not row.report.get("error") and not _was_regression(row)
        and not row.report.get("throttled")  # a throttled run is no baseline either
    ]
    return [item for item in eligible if item[1]][-checks:]


def _regression(
    store: Store | None, option: str, report: CheckReport, policy: RegressionPolicy, *, bundle: str,
    device: str, artifacts: int,
) -> tuple[RegressionVerdict | None, bool]:
    """(verdict or None when no baseline is asked for, whether the user named the baseline check)."""
    if store is None or option == "none" or report.error or report.latency_ms is None:
        return None, False
    current = list(report.latency_samples_ms)
    if option == "last":
        from toolkit.store.engine import StoreUnavailable

        try:
            runs = baseline_samples(store, bundle=bundle, device=device, artifact=report.artifact,
                                    checks=policy.baseline_checks, artifacts=artifacts)
        except StoreUnavailable as exc:
            return RegressionVerdict(None, skip=f"the check history could not be read ({exc.message})"), False
        return decide(current, runs, policy), False
    found = store.by_id(option, artifact=report.artifact)
    if found is None:
        raise UsageError(
            f"No stored check {option!r} for {report.artifact}.",
            hint="Use --baseline last, none, or an id from `edgetk history`.",
        )
    samples = _stored_samples(found)
    if not samples:
        return RegressionVerdict(None, skip=f"the baseline check {found.check_id} holds no latency samples "
                                 "(recorded by an older edgetk); pick a newer one"), True
    return decide(current, [(found.check_id, samples)], policy, min_checks=1), True


# --------------------------------------------------------------------------------------------- check


def on_device_accuracy(device: Device, bundle: Bundle, vdir: str, reports: list[CheckReport], *,
                       evaluate: bool) -> list[CheckReport]:
    """Outputs that differ from the golden ones get the first diverging layer named (:mod:`toolkit.checks.divergence`);
    with ``evaluate`` every artifact that ran gets the eval set scored (:mod:`toolkit.checks.device_eval`)."""
    from toolkit.checks import device_eval, divergence

    out = []
    for report in reports:
        match = report.outputs_match
        if not report.error and match is not None and not match.get("ok"):
            try:
                found = divergence.locate(device, bundle, vdir, report.artifact)
            except ToolkitError as exc:
                found = {"available": False, "note": exc.message}
            failures = tuple(f + divergence.text(found) if "outputs differ" in f else f
                             for f in report.gates.failures)
            report = replace(report, gates=replace(report.gates, failures=failures,
                                                   details={**report.gates.details, "divergence": found}))
        out.append(report)
    if evaluate:
        ran = [r.artifact for r in out if not r.error]
        try:
            results = device_eval.evaluate(device, bundle, vdir, ran) if ran else {}
        except ToolkitError as exc:
            results = {a: {"available": False, "note": exc.message} for a in ran}
        out = [device_eval.attach(r, results.get(r.artifact)) for r in out]
    return out




def runner_flags(*, profile: bool = False, throughput: bool = False, loads: bool = False) -> tuple[str, ...]:
    """The runner's flags for what a check measures beyond latency (each adds its own key to the report)."""
    return tuple(f"--{name}" for name, on in (("profile", profile), ("throughput", throughput), ("loads", loads))
                 if on)


def _run_runner(device: Device, argv: Sequence[str], artifacts: Sequence[str], timeout: float) -> list[CheckReport]:
    """One runner process on the device: its reports for ``artifacts``."""
    result = device.conn.run(list(argv), timeout=timeout)
    if not result.stdout.strip():
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise DeviceError(
            f"{device.spec.name}: the runner failed with exit code {result.returncode} and no report ({tail}).",
            hint=f"Is {device.python!r} a working Python on the device? Set `python` in the inventory.",
        )
    return parse_runner_output(result.stdout, device=device.spec.name, artifacts=list(artifacts))


def check(
    device: Device,
    bundle: Bundle,
    *,
    runs: int = 50,
    warmup: int = 5,
    gates: GateOptions | None = None,
    store: Store | None = None,
    timeout: float = CHECK_TIMEOUT_S,
    runner_args: Sequence[str] = (),
    evaluate: bool = False,
) -> list[CheckReport]:
    """Run every artifact of ``bundle`` (which must be installed on the device), gate, store; return reports.

    ``runner_args``: what else the runner measures (``--profile``, ``--throughput``, ``--loads``: see
    :func:`runner_flags`)."""
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
    latency_argv = [device.python, f"{vdir}/{runner}", "check", "--bundle", vdir, "--runs", str(runs), "--warmup",
                    str(warmup)]
    argv = [*latency_argv, *runner_args]
    artifacts = [a.file for a in bundle.manifest.artifacts]
    reports = _run_runner(device, argv, artifacts, timeout)
    policy = bundle.manifest.check_policy
    budget = budget_for(policy, gates)
    regression_policy = regression_policy_for(policy, gates)
    formats = {a.file: str(a.format) for a in bundle.manifest.artifacts}
    notes = (NO_POLICY,) if policy is None else ()

    def judged(report: CheckReport) -> tuple[RegressionVerdict | None, bool]:
        if report.throttled:  # a throttled run decides no regression (nor a selection: toolkit.checks.selection)
            return RegressionVerdict(None, skip=f"measured while the device throttled: {report.throttled}"), False
        return _regression(store, gates.baseline, report, regression_policy, bundle=name, device=device.spec.name,
                           artifacts=len(artifacts))

    verdicts = {report.artifact: judged(report) for report in reports}
    suspects = [a for a, (verdict, _) in verdicts.items() if verdict is not None and verdict.regressed]
    if suspects:  # measured again in a fresh runner process: a regression must show in both (``confirmed``)
        extra = [flag for a in suspects for flag in ("--artifact", a)]
        again = {r.artifact: r for r in _run_runner(device, [*latency_argv, *extra], suspects, timeout)}
        for artifact in suspects:
            first, explicit = verdicts[artifact]
            second = again.get(artifact)
            assert first is not None
            verdicts[artifact] = (confirmed(first, judged(second)[0] if second is not None else None), explicit)
    gated = []
    for report in reports:
        verdict, explicit = verdicts[report.artifact]
        result_gate = gate(
            report, budget=budget, regression=verdict, regression_policy=regression_policy,
            explicit_baseline=explicit, placement=policy.placement if policy else (),
            throughput_floor=policy.min_throughput_ips if policy else None,
            artifact_format=formats.get(report.artifact), notes=notes,
        )
        gated.append(replace(report, gates=result_gate))
    gated = on_device_accuracy(device, bundle, vdir, gated, evaluate=evaluate)
    if store is not None:
        run_id = store.new_run_id()
        ids = store.record(gated, bundle=name, version=bundle.version, run_id=run_id)
        gated = [replace(r, check_id=i) for r, i in zip(gated, ids)]
    return gated
