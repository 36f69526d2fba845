"""Check a deployed bundle ON the device: run its runner, parse the JSON, gate, record in the history.

What is not measured is gated from the bundle's own ``check_policy`` (:mod:`toolkit.model.policy` says why),
never from a profile looked up again by name; ``--budget-ms`` and ``--regression-pct`` override it. The gates
(ran, outputs match, budget, regression, placement, throughput: ``GATES`` in :mod:`toolkit.checks.gates`) are in
docs/verification.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from toolkit.delivery.bundle import Bundle
from toolkit.delivery.deployment import Device, installed_version, version_dir
from toolkit.errors import ToolkitError, UsageError
from toolkit.model.policy import GateOptions, RegressionPolicy
from toolkit.regression import RegressionVerdict, confirmed, decide
from toolkit.store import Store, StoredCheck
from toolkit.checks.gates import Evidence, Limits, judge
from toolkit.checks.runner_fate import evidence
from toolkit.model.runner_report import invalid_figure, latency_samples, parse_runner_output
from toolkit.model.device_records import CheckReport

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 900.0


def _stored_samples(stored: StoredCheck) -> list[float]:
    return list(latency_samples(stored.report.get("latency_samples_ms")))


def _was_regression(stored: StoredCheck) -> bool:
    regression = ((stored.report.get("gates") or {}).get("details") or {}).get("regression") or {}
    return regression.get("regressed") is True


def baseline_samples(
    store: Store, *, bundle: str, device: str, artifact: str, checks: int, artifacts: int = 1
) -> list[tuple[str, list[float]]]:
    """[(check_id, samples)] of the newest ``checks`` checks of this bundle name, device and artifact that
    measured something, were not regressions themselves and not taken while the device throttled, oldest
    first; a row whose figures fail validation (recorded by an edgetk that did not validate) is no baseline."""
    rows = store.history(device=device, bundle=bundle, limit=max(50, 4 * checks * artifacts))
    eligible = [
        (row.check_id, _stored_samples(row))
        for row in rows
        if row.artifact == artifact and not row.report.get("error") and not _was_regression(row)
        and not row.report.get("throttled")  # a throttled run is no baseline either
        and invalid_figure(row.report) is None
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
    problem = invalid_figure(found.report)
    if problem:
        return RegressionVerdict(None, skip=f"the baseline check {found.check_id} holds impossible figures "
                                 f"({problem}); pick another"), True
    return decide(current, [(found.check_id, samples)], policy, min_checks=1), True


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


def require_baseline(store: Store, baseline: str) -> None:
    """A baseline named by its check id must be in the history (``last`` and ``none`` name no check)."""
    if baseline not in ("last", "none") and not store.exists(baseline):
        raise UsageError(f"No stored check {baseline!r} in {store.path}.",
                         hint="Use --baseline last, none, or an id from `edgetk history`.")


def runner_flags(*, profile: bool = False, throughput: bool = False, loads: bool = False) -> tuple[str, ...]:
    """The runner's flags for what a check measures beyond latency (each adds its own key to the report)."""
    return tuple(f"--{name}" for name, on in (("profile", profile), ("throughput", throughput), ("loads", loads))
                 if on)


def _run_runner(device: Device, argv: Sequence[str], artifacts: Sequence[str], timeout: float, *,
                sizes: Mapping[str, int], runs: int, warmup: int) -> list[CheckReport]:
    """One runner process on the device: its reports for ``artifacts``, from a whole run only
    (:mod:`toolkit.checks.runner_fate`), each report's figures validated against the ``runs`` and ``warmup``
    asked for (:func:`toolkit.model.runner_report.invalid_figure`)."""
    result = device.conn.run(list(argv), timeout=timeout)
    document = evidence(device, result, runner=argv[1], sizes={a: sizes[a] for a in artifacts if a in sizes})
    return parse_runner_output(document, device=device.spec.name, artifacts=list(artifacts), runs=runs,
                               warmup=warmup)


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
    if store is not None:
        require_baseline(store, gates.baseline)
    name = bundle.name
    installed = installed_version(device, name)
    vdir = version_dir(name, bundle.version, base=device.base)
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
    sizes = {a.file: int(a.bytes) for a in bundle.manifest.artifacts}
    reports = _run_runner(device, argv, artifacts, timeout, sizes=sizes, runs=runs, warmup=warmup)
    limits = Limits(bundle.manifest.check_policy, gates)
    regression_policy = limits.regression
    formats = {a.file: str(a.format) for a in bundle.manifest.artifacts}

    def judged(report: CheckReport) -> tuple[RegressionVerdict | None, bool]:
        if report.throttled:  # a throttled run decides no regression (nor a selection: toolkit.checks.selection)
            return RegressionVerdict(None, skip=f"measured while the device throttled: {report.throttled}"), False
        return _regression(store, gates.baseline, report, regression_policy, bundle=name, device=device.spec.name,
                           artifacts=len(artifacts))

    verdicts = {report.artifact: judged(report) for report in reports}
    suspects = [a for a, (verdict, _) in verdicts.items() if verdict is not None and verdict.regressed]
    if suspects:  # measured again in a fresh runner process: a regression must show in both (``confirmed``)
        extra = [flag for a in suspects for flag in ("--artifact", a)]
        again = {r.artifact: r for r in _run_runner(device, [*latency_argv, *extra], suspects, timeout, sizes=sizes,
                                                     runs=runs, warmup=warmup)}
        for artifact in suspects:
            first, explicit = verdicts[artifact]
            second = again.get(artifact)
            assert first is not None
            verdicts[artifact] = (confirmed(first, judged(second)[0] if second is not None else None), explicit)
    gated = [replace(report, gates=judge(Evidence(report, formats.get(report.artifact), *verdicts[report.artifact]),
                                         limits))
             for report in reports]
    gated = on_device_accuracy(device, bundle, vdir, gated, evaluate=evaluate)
    if store is not None:
        run_id = store.new_run_id()
        ids = store.record(gated, bundle=name, version=bundle.version, run_id=run_id)
        gated = [replace(r, check_id=i) for r, i in zip(gated, ids)]
    return gated
