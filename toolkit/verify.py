"""Compare an artifact's outputs with the float model's on held-out inputs, and time it on this host.

The convert stage calls :func:`verify_outputs` once per candidate artifact; it returns a
:class:`VerificationResult` (the manifest's :class:`~toolkit.types.Verification` record, every broken
tolerance in plain words, and why the verdict is vacuous when it proves nothing). The metrics live in
:mod:`toolkit.verification`: per output and per slice of outputs that mix ranges (a detection head's boxes and
scores), and per task (classification top-1/top-5 and accuracy, detection recall/precision against the float
model, segmentation mask IoU, embedding cosine and relative error, a user's ``--metric``). Non-finite outputs
make every metric non-finite, so a NaN model can never pass a tolerance.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from toolkit.types import Verification
from toolkit.verification.outputs import VerificationResult, verify_outputs
from toolkit.verification.tasks import Task, parse_task
from toolkit.verification.tolerance import Tolerance
from toolkit.verification.user_metric import UserMetric
from toolkit.verification.user_metric import load as load_metric

__all__ = ["Outputs", "Task", "Tolerance", "UserMetric", "VerificationResult", "compare", "is_classifier",
           "load_metric", "median_latency_ms", "parse_task", "run_all", "tolerance_failures", "verify_outputs"]

Outputs = list[np.ndarray]


def is_classifier(output: np.ndarray) -> bool:
    """A (batch, classes) output with more than one class."""
    return output.ndim == 2 and output.shape[-1] > 1


def compare(
    reference: Sequence[Outputs],
    actual: Sequence[Outputs],
    *,
    labels: np.ndarray | None = None,
    tolerance: Tolerance | None = None,
) -> Verification:
    """The manifest record of ``actual`` against ``reference`` (see :func:`verify_outputs` for the verdict)."""
    return verify_outputs(reference, actual, tolerance=tolerance or Tolerance(), labels=labels).verification


def tolerance_failures(verification: Verification, tolerance: Tolerance) -> list[str]:
    """Every way ``verification``'s whole-model numbers break ``tolerance`` (cosine, top-1), in plain words.

    Kept for callers that hold only a record; :func:`verify_outputs` applies every tolerance (slices, task)."""
    reasons = []
    cosine = verification.cosine_similarity
    if not np.isfinite(cosine):
        return ["outputs are NaN/Inf"]
    if cosine < tolerance.min_cosine:
        reasons.append(f"cosine similarity {cosine:.4f} < {tolerance.min_cosine}")
    if verification.accuracy is not None and verification.reference_accuracy is not None:
        drop = verification.reference_accuracy - verification.accuracy
        if drop > tolerance.max_top1_drop + 1e-9:
            reasons.append(
                f"top-1 accuracy {verification.accuracy:.3f} vs float {verification.reference_accuracy:.3f} "
                f"(drop {drop * 100:.1f} points > {tolerance.max_top1_drop * 100:.1f})"
            )
    elif verification.top1_agreement is not None:
        drop = 1.0 - verification.top1_agreement
        if drop > tolerance.max_top1_drop + 1e-9:
            reasons.append(
                f"top-1 agreement with the float model {verification.top1_agreement:.3f} "
                f"(< {1 - tolerance.max_top1_drop:.3f})"
            )
    return reasons


def run_all(run: Callable[[Mapping[str, np.ndarray]], Outputs], feeds: Sequence[Mapping[str, np.ndarray]]) -> list[Outputs]:
    return [[np.asarray(o) for o in run(feed)] for feed in feeds]


def median_latency_ms(
    run: Callable[[Mapping[str, np.ndarray]], object],
    feed: Mapping[str, np.ndarray],
    *,
    warmup: int = 3,
    runs: int = 30,
    budget_s: float = 2.0,
) -> float:
    """Median wall time of ``run(feed)`` over up to ``runs`` runs (fewer if ``budget_s`` runs out, at least 5)."""
    for _ in range(warmup):
        run(feed)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs and (len(times) < 5 or time.perf_counter() - start < budget_s):
        begin = time.perf_counter()
        run(feed)
        times.append((time.perf_counter() - begin) * 1000.0)
    return statistics.median(times)
