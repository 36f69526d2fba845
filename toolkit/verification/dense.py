"""Classification, embedding and regression metrics of one output against the float model's."""

from __future__ import annotations

import math

import numpy as np


def classification_metrics(ref: np.ndarray, act: np.ndarray, labels: np.ndarray | None) -> dict[str, float | None]:
    """Top-1 (and top-5 where there are more than 5 classes) agreement with the float model; accuracy of
    both against ``labels`` when there is one label per sample."""
    r = ref.reshape(ref.shape[0], -1)
    a = np.nan_to_num(act.reshape(act.shape[0], -1), nan=-np.inf)
    finite = bool(np.all(np.isfinite(act)))
    ref_top = np.argmax(r, axis=1)
    act_top = np.argmax(a, axis=1)
    out: dict[str, float | None] = {"top1_agreement": float(np.mean(ref_top == act_top)) if finite else 0.0}
    if r.shape[1] > 5:
        top5 = np.argsort(-a, axis=1)[:, :5]
        out["top5_agreement"] = float(np.mean([t in row for t, row in zip(ref_top, top5)])) if finite else 0.0
    if labels is not None and len(labels) == r.shape[0]:
        truth = np.asarray(labels).reshape(-1)
        out["reference_accuracy"] = float(np.mean(ref_top == truth))
        out["accuracy"] = float(np.mean(act_top == truth)) if finite else 0.0
    return out


def embedding_metrics(ref: np.ndarray, act: np.ndarray) -> dict[str, float]:
    """Cosine of each vector (the last axis) with the float one (mean and worst) and the relative error."""
    r = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    a = act.reshape(-1, act.shape[-1]).astype(np.float64)
    if not np.all(np.isfinite(a)):
        return {"mean_cosine": float("nan"), "min_cosine": float("nan"), "relative_error": float("nan")}
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(a, axis=1)
    dots = np.sum(r * a, axis=1)
    cos = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), np.where(np.all(r == a, axis=1), 1.0, 0.0))
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
            "relative_error": relative_error(ref, act)}


def relative_error(ref: np.ndarray, act: np.ndarray) -> float:
    """``||act - ref|| / ||ref||`` over the whole output (0 when both are zero)."""
    r = np.ravel(ref).astype(np.float64)
    a = np.ravel(act).astype(np.float64)
    if not np.all(np.isfinite(a)):
        return float("nan")
    norm = float(np.linalg.norm(r))
    diff = float(np.linalg.norm(a - r))
    return diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))


def range_error(actual: np.ndarray, want: np.ndarray) -> float:
    """RMS(actual - want) over want's range (0 when want is constant and actual equals it; inf when the sizes
    differ or actual is not finite): the error a layer probe records on the host (``host_error``) and a check
    measures on the device (:mod:`toolkit.checks.divergence`), one measure for both."""
    a, w = np.asarray(actual, dtype=np.float64).ravel(), np.asarray(want, dtype=np.float64).ravel()
    if a.size != w.size or not np.all(np.isfinite(a)):
        return math.inf
    noise = float(np.sqrt(np.mean((a - w) ** 2))) if w.size else 0.0
    span = float(w.max() - w.min()) if w.size else 0.0
    return noise / span if span > 0 else (0.0 if noise == 0 else math.inf)
