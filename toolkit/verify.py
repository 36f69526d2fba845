"""Compare an artifact's outputs with the float model's on held-out inputs, and time it on this host.

Metrics (architecture.md): max/mean absolute error, cosine similarity, top-1 agreement with the float model
for classifier outputs (no labels needed), and accuracy when the eval data carries labels under ``y``.
Non-finite outputs make every metric non-finite, so a NaN model can never pass a tolerance.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from toolkit.types import Verification

Outputs = list[np.ndarray]


@dataclass(frozen=True)
class Tolerance:
    """How much an artifact may differ from the float model and still ship as preferred."""

    max_top1_drop: float = 0.01  # accuracy points (0.01 = 1 point), or 1 - top-1 agreement without labels
    min_cosine: float = 0.99


def is_classifier(output: np.ndarray) -> bool:
    """A (batch, classes) output with more than one class."""
    return output.ndim == 2 and output.shape[-1] > 1


def compare(
    reference: Sequence[Outputs],
    actual: Sequence[Outputs],
    *,
    labels: np.ndarray | None = None,
) -> Verification:
    """Metrics of ``actual`` (one list of outputs per sample) against ``reference`` (the float model)."""
    ref_flat = np.concatenate([np.concatenate([np.ravel(o) for o in outs]) for outs in reference]).astype(np.float64)
    act_flat = np.concatenate([np.concatenate([np.ravel(o) for o in outs]) for outs in actual]).astype(np.float64)
    if ref_flat.shape != act_flat.shape:
        raise ValueError(f"output sizes differ: {ref_flat.shape} vs {act_flat.shape}")
    diff = np.abs(ref_flat - act_flat)
    finite = bool(np.all(np.isfinite(act_flat)))
    max_abs = float(diff.max()) if finite else float("nan")
    mean_abs = float(diff.mean()) if finite else float("nan")
    denom = float(np.linalg.norm(ref_flat) * np.linalg.norm(act_flat))
    if not finite:
        cosine = float("nan")
    elif denom == 0.0:
        cosine = 1.0 if np.array_equal(ref_flat, act_flat) else 0.0
    else:
        cosine = float(np.dot(ref_flat, act_flat) / denom)

    top1 = accuracy = reference_accuracy = None
    first_ref = [outs[0] for outs in reference]
    if first_ref and is_classifier(np.asarray(first_ref[0])):
        ref_classes = np.concatenate([np.argmax(o, axis=-1) for o in first_ref])
        act_classes = np.concatenate([np.argmax(outs[0], axis=-1) for outs in actual])
        if not finite:
            top1 = 0.0
        else:
            top1 = float(np.mean(ref_classes == act_classes))
        if labels is not None and len(labels) == len(ref_classes):
            truth = np.asarray(labels).reshape(-1)
            reference_accuracy = float(np.mean(ref_classes == truth))
            accuracy = float(np.mean(act_classes == truth)) if finite else 0.0
    return Verification(
        max_abs_error=max_abs,
        mean_abs_error=mean_abs,
        cosine_similarity=cosine,
        top1_agreement=top1,
        samples=len(reference),
        accuracy=accuracy,
        reference_accuracy=reference_accuracy,
    )


def tolerance_failures(verification: Verification, tolerance: Tolerance) -> list[str]:
    """Every way ``verification`` breaks ``tolerance`` (empty when it passes), in plain words."""
    reasons = []
    cosine = verification.cosine_similarity
    if not np.isfinite(cosine):
        reasons.append("outputs are NaN/Inf")
        return reasons
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
