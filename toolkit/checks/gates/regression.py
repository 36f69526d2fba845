"""The regression gate: the artifact's latency against the history of the same bundle, device and artifact.
The check decides the verdict before the gates (:func:`toolkit.checks.checking.check`: the baseline from the
store, a suspect measured again in a fresh runner process); this gate words it against the policy's thresholds."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.checks.gates.gate import Evidence, Limits, Verdict
from toolkit.model.policy import RegressionPolicy
from toolkit.regression import RegressionVerdict


@dataclass(frozen=True)
class RegressionGate:
    """Fails a confirmed regression; notes one a second runner process did not confirm, or why it could not
    judge (too few baseline checks, a throttled device); nothing when no baseline was asked for."""

    def judge(self, evidence: Evidence, limits: Limits) -> Verdict:
        verdict, name = evidence.regression, evidence.report.artifact
        if verdict is None:
            return Verdict()
        details = {"regression": verdict.to_dict()}
        if verdict.regressed:
            failure = regression_text(name, verdict, limits.regression, evidence.explicit_baseline)
            return Verdict((failure,), details=details)
        if verdict.confirmed is False and verdict.current_p50_ms is not None:
            return Verdict(skipped=(f"regression of {name}: not confirmed: p50 {verdict.current_p50_ms:.3f} ms "
                                    f"was {verdict.ratio:.2f}x the baseline, a second runner process measured "
                                    f"{verdict.confirm_p50_ms:.3f} ms (one slow process, not a slower artifact)",),
                           details=details)
        if verdict.skip:
            return Verdict(skipped=(f"regression of {name}: {verdict.skip}",), details=details)
        return Verdict(details=details)


def regression_text(name: str, verdict: RegressionVerdict, policy: RegressionPolicy, explicit: bool) -> str:
    assert verdict.current_p50_ms is not None and verdict.reference_ms is not None
    against = (f"baseline {verdict.baseline_checks[0]}" if explicit
               else f"the slowest of the last {len(verdict.baseline_checks)} checks")
    return (f"{name}: p50 {verdict.current_p50_ms:.3f} ms is {verdict.ratio:.2f}x {against} "
            f"({verdict.reference_ms:.3f} ms; {verdict.baseline_samples} baseline samples, Mann-Whitney "
            f"p={verdict.p_value:.2g}); a regression is more than +{policy.min_slowdown_pct:g}% and "
            f"+{policy.min_slowdown_ms:g} ms"
            + (f"; a second runner process confirmed it (p50 {verdict.confirm_p50_ms:.3f} ms)"
               if verdict.confirmed else ""))
