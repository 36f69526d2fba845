"""Is this check slower than the history of the same artifact on the same device? Statistics, stdlib only.

Why not "p50 more than 10% above the last passing p50": on the machines this was measured on, one runner
process's median lands on one of two levels about 1.5x apart from one process to the next (findings.md
section 5), so comparing one process against one other failed about half the time, and the baseline
ratcheted to the luckiest run. The decision here (:func:`decide`, thresholds in
:class:`toolkit.model.policy.RegressionPolicy`) pools the raw samples of several earlier checks, asks a
rank test whether the new samples are slower at all, and demands an effect beyond the slowest level the
unchanged artifact has already shown, in percent AND in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from toolkit.model.policy import RegressionPolicy

MIN_SAMPLES = 5  # below this a rank test says nothing useful (``--runs`` lower than 5)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of no values")
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value of the Mann-Whitney U test that ``x`` tends to be larger than ``y``.

    Normal approximation with tie correction and continuity correction (as scipy's ``mannwhitneyu(...,
    alternative="greater", method="asymptotic")``); fine from about 5 samples a side.
    """
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("the Mann-Whitney U test needs samples on both sides")
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    rank_sum_x = 0.0
    tie_term = 0.0
    i, n = 0, n1 + n2
    while i < n:
        j = i
        while j + 1 < n and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        rank = 0.5 * (i + j) + 1.0  # average rank of the tied block (1-based)
        count = j - i + 1
        rank_sum_x += rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        tie_term += count**3 - count
        i = j + 1
    u = rank_sum_x - n1 * (n1 + 1) / 2.0
    mean = n1 * n2 / 2.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0  # every value equal: no evidence either way
    z = (u - mean - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True)
class RegressionVerdict:
    """What the regression gate found; ``regressed`` None when it could not decide (``skip`` says why)."""

    regressed: bool | None
    current_p50_ms: float | None = None
    reference_ms: float | None = None  # the slowest per-check median among the baseline checks
    pooled_p50_ms: float | None = None
    ratio: float | None = None  # current median / reference
    p_value: float | None = None
    baseline_checks: tuple[str, ...] = ()
    baseline_samples: int = 0
    skip: str | None = None
    # a suspected regression is measured again in a fresh runner process (``checking.check``): that run's p50
    # and whether it regressed too (the check regresses only when both did); None when no second run was made
    confirm_p50_ms: float | None = None
    confirmed: bool | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "regressed": self.regressed, "current_p50_ms": self.current_p50_ms, "reference_ms": self.reference_ms,
            "pooled_p50_ms": self.pooled_p50_ms, "ratio": self.ratio, "p_value": self.p_value,
            "baseline_checks": list(self.baseline_checks), "baseline_samples": self.baseline_samples,
            "skip": self.skip, "confirm_p50_ms": self.confirm_p50_ms, "confirmed": self.confirmed,
        }


def confirmed(first: RegressionVerdict, second: RegressionVerdict | None) -> RegressionVerdict:
    """``first`` (a regression) judged with the verdict of a second runner process on the same baseline: it
    stays a regression only when the second run regressed too. One runner process's median can land on a
    slower level of a shared or throttled device for its whole run (the module docstring: two levels up to
    about 1.5x apart), so one slow process is not yet a regression; a real slowdown is slow in both."""
    if second is None or second.regressed is None:  # no second measurement: the first verdict stands
        return first
    return replace(first, regressed=bool(second.regressed), confirm_p50_ms=second.current_p50_ms,
                   confirmed=bool(second.regressed))


def decide(
    current: Sequence[float],
    baseline: Sequence[tuple[str, Sequence[float]]],
    policy: RegressionPolicy,
    *,
    min_checks: int | None = None,
) -> RegressionVerdict:
    """Regression verdict for ``current`` samples (ms) against ``baseline`` = [(check_id, samples_ms)].

    ``min_checks`` overrides ``policy.min_baseline_checks`` (1 when the user named the baseline check).
    """
    current = [float(v) for v in current]
    runs = [(check_id, [float(v) for v in samples]) for check_id, samples in baseline if len(samples) >= MIN_SAMPLES]
    ids = tuple(check_id for check_id, _ in runs)
    needed = policy.min_baseline_checks if min_checks is None else min_checks
    if len(current) < MIN_SAMPLES:
        return RegressionVerdict(None, skip=f"this check has {len(current)} latency samples; the regression "
                                 f"test needs at least {MIN_SAMPLES} (--runs {MIN_SAMPLES} or more)")
    if len(runs) < needed:
        return RegressionVerdict(
            None, current_p50_ms=median(current), baseline_checks=ids,
            skip=f"{len(runs)} of the {needed} earlier checks it compares with so far",
        )
    pooled = [v for _, samples in runs for v in samples]
    reference = max(median(samples) for _, samples in runs)
    now = median(current)
    ratio = now / reference if reference > 0 else math.inf
    p_value = mann_whitney_greater(current, pooled)
    regressed = bool(
        p_value < policy.alpha
        and ratio > 1.0 + policy.min_slowdown_pct / 100.0
        and now - reference > policy.min_slowdown_ms
    )
    return RegressionVerdict(
        regressed=regressed, current_p50_ms=now, reference_ms=reference, pooled_p50_ms=median(pooled),
        ratio=ratio, p_value=p_value, baseline_checks=ids, baseline_samples=len(pooled),
    )


class Difference(StrEnum):
    """Two sets of latency samples compared: the first is faster, slower, or inside the noise of the second."""

    FASTER = "faster"
    SLOWER = "slower"
    SAME = "same"  # inside the noise: no speedup measured either way


def compare(a: Sequence[float], b: Sequence[float], *, alpha: float, min_pct: float,
            min_ms: float) -> tuple[Difference, float, float]:
    """``a`` against ``b`` (ms): (difference, p that a is slower, p that a is faster). A difference counts only
    when a one-sided Mann-Whitney U test says so at ``alpha`` AND the medians differ by more than ``min_pct``
    percent and ``min_ms`` milliseconds (the regression gate's rule, both ways)."""
    p_slower = mann_whitney_greater(a, b)
    p_faster = mann_whitney_greater(b, a)
    ma, mb = median(a), median(b)

    def beyond(slow: float, fast: float, p: float) -> bool:
        return p < alpha and slow > fast * (1.0 + min_pct / 100.0) and slow - fast > min_ms

    difference = (Difference.SLOWER if beyond(ma, mb, p_slower) else Difference.FASTER if beyond(mb, ma, p_faster)
                  else Difference.SAME)
    return difference, p_slower, p_faster
