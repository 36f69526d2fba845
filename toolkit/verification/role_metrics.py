"""The metrics of one output for its role (:mod:`.roles`), and the tolerance each is gated by.

:func:`score` measures the artifact's output against the float model's over the eval set; :func:`failures`
reads the recorded metrics back (a manifest's record gives the same verdict as the stage that measured it).
"""

from __future__ import annotations

import math

import numpy as np

from toolkit.model.records import JsonDict, JsonObject
from toolkit.model.heads import HeadSpec
from toolkit.verification import dense, detection_head, ordinal, segmentation
from toolkit.model.roles import OutputRole, Role
from toolkit.verification.inference import core_view
from toolkit.model.tolerance import Tolerance

MIN_POSITIVES = 1e-3  # a probability map with fewer positions above 0.5 (a fraction) is judged by its error


def score(role: OutputRole, ref: np.ndarray, act: np.ndarray) -> JsonDict:
    """The role's metrics of ``act`` against ``ref`` (both ``[samples, ...]``); empty for the roles a
    model-level metric judges (a detector's outputs, a step model's state)."""
    r, a = core_view(ref).astype(np.float64), core_view(act).astype(np.float64)
    finite = bool(np.all(np.isfinite(a)))
    a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    kind = role.role
    if kind is Role.CLASSIFICATION:
        if r[0].size <= 1:
            flat_r, flat_a = r.reshape(len(r)), a.reshape(len(a))
            cut = 0.5 if (flat_r.min() >= -1e-3 and flat_r.max() <= 1 + 1e-3) else 0.0
            out: JsonDict = {"decision_agreement": float(np.mean((flat_r > cut) == (flat_a > cut)))}
        else:
            out = dict(dense.classification_metrics(r.reshape(len(r), -1), a.reshape(len(a), -1), None))
        return _unless(finite, out)
    if kind is Role.BOXES:
        out = {"error_to_range": _error_to_range(r, a)}
        iou = _box_iou(r, a)
        if iou is not None:
            out["mean_iou"] = iou
        return _unless(finite, out)
    if kind is Role.LANDMARKS:
        return _unless(finite, {"error_to_spread": _error_to_spread(r, a),
                                "max_abs_error": float(np.max(np.abs(r - a))) if r.size else 0.0})
    if kind is Role.DENSE:
        return _unless(finite, _dense(role, ref, act, r, a))
    if kind is Role.SEQUENCE:
        return _unless(finite, _sequence(role, r, a))
    if kind is Role.EMBEDDING:
        e = dense.embedding_metrics(r, a)
        return _unless(finite, {"mean_cosine": e["mean_cosine"], "min_cosine": e["min_cosine"]})
    if kind is Role.REGRESSION:
        out = {"relative_error": dense.relative_error(r, a)}
        if r.ndim == 2 and r.shape[-1] > 1:  # a vector of scores: each component against its own spread
            out["component_error_to_spread"] = _component_error(r, a)
        return _unless(finite, out)
    if kind is Role.ORDINAL:
        return _unless(finite, ordinal.metrics(r, a, bin_size=role.bin_size, unit=role.unit))
    if kind is Role.DETECTION_HEAD:
        head = detection_head.infer(ref, spec=role.head or HeadSpec(), loose=True)
        if head is None:
            return {"not_decoded": f"{list(ref.shape[1:])} is no [N, 4+1+C], [N, 4+C] or [4+C, N] head"}
        return _unless(finite, detection_head.metrics(r, a, head))
    return {}


def _component_error(r: np.ndarray, a: np.ndarray) -> float:
    """The worst component's RMS error over its float spread (standard deviation) over the eval set."""
    worst = 0.0
    for c in range(r.shape[-1]):
        spread = float(np.std(r[:, c]))
        error = float(np.sqrt(np.mean((a[:, c] - r[:, c]) ** 2)))
        worst = max(worst, error / spread if spread > 0 else (0.0 if error == 0 else math.inf))
    return worst


def _unless(finite: bool, metrics: JsonDict) -> JsonDict:
    """Non-finite artifact outputs make every metric NaN (never a pass)."""
    return metrics if finite else {k: math.nan for k in metrics}


def _error_to_range(r: np.ndarray, a: np.ndarray) -> float:
    """The worst coordinate's largest error as a fraction of that coordinate's float range over the eval set
    (the whole output's range when a coordinate does not vary)."""
    rows_r, rows_a = r.reshape(len(r), -1, r.shape[-1]), a.reshape(len(a), -1, a.shape[-1])
    whole = float(np.ptp(r)) or 1.0
    worst = 0.0
    for c in range(rows_r.shape[-1]):
        span = float(np.ptp(rows_r[..., c])) or whole
        worst = max(worst, float(np.max(np.abs(rows_r[..., c] - rows_a[..., c]))) / span)
    return worst


def _box_iou(r: np.ndarray, a: np.ndarray) -> float | None:
    """Mean IoU of the float and artifact boxes when the last axis is 4 coordinates that decode as boxes
    (x1 < x2 and y1 < y2 everywhere, or positive widths and heights), else None."""
    if r.shape[-1] != 4:
        return None
    rr, aa = r.reshape(-1, 4), a.reshape(-1, 4)
    if np.all(rr[:, 2] > rr[:, 0]) and np.all(rr[:, 3] > rr[:, 1]):
        rb, ab = rr, aa
    elif np.all(rr[:, 2] > 0) and np.all(rr[:, 3] > 0):
        rb, ab = _xyxy(rr), _xyxy(aa)
    else:
        return None
    x1, y1 = np.maximum(rb[:, 0], ab[:, 0]), np.maximum(rb[:, 1], ab[:, 1])
    x2, y2 = np.minimum(rb[:, 2], ab[:, 2]), np.minimum(rb[:, 3], ab[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_r = (rb[:, 2] - rb[:, 0]) * (rb[:, 3] - rb[:, 1])
    area_a = np.clip(ab[:, 2] - ab[:, 0], 0, None) * np.clip(ab[:, 3] - ab[:, 1], 0, None)
    union = area_r + area_a - inter
    return float(np.mean(np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)))


def _xyxy(b: np.ndarray) -> np.ndarray:
    return np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2], 1)


def _error_to_spread(r: np.ndarray, a: np.ndarray) -> float:
    """RMS error over the RMS spread of the float coordinates around their mean over the eval set (0: exact,
    1: no better than answering the mean point for every input)."""
    spread = float(np.sqrt(np.mean((r - r.mean(axis=0, keepdims=True)) ** 2)))
    error = float(np.sqrt(np.mean((a - r) ** 2)))
    return error / spread if spread > 0 else (0.0 if error == 0 else math.inf)


def _dense(role: OutputRole, ref: np.ndarray, act: np.ndarray, r: np.ndarray, a: np.ndarray) -> JsonDict:
    if role.classes_axis is not None:
        s = segmentation.segmentation_metrics(ref, act, axis=role.classes_axis)
        return s.to_dict()
    if r.size and r.min() >= -1e-3 and r.max() <= 1 + 1e-3:  # each position a probability of its own
        rm, am = r > 0.5, a > 0.5
        positives = float(np.mean(rm))
        union = float(np.sum(rm | am))
        out = {"position_agreement": float(np.mean(rm == am)), "positive_fraction": positives,
               "iou": float(np.sum(rm & am)) / union if union else 1.0}
        if positives < MIN_POSITIVES:
            out["relative_error"] = dense.relative_error(r, a)
        return out
    return {"relative_error": dense.relative_error(r, a)}


def ctc_decode(top: np.ndarray, blank: int) -> tuple[int, ...]:
    """Greedy CTC: collapse repeated classes, drop the blank."""
    out: list[int] = []
    previous = -1
    for c in top.tolist():
        if c != previous and c != blank:
            out.append(int(c))
        previous = c
    return tuple(out)


def _sequence(role: OutputRole, r: np.ndarray, a: np.ndarray) -> JsonDict:
    rt, at = np.argmax(r, axis=-1), np.argmax(a, axis=-1)  # [samples, T]
    out: JsonDict = {"step_agreement": float(np.mean(rt == at)) if rt.size else 1.0}
    if role.blank is not None:
        rows_r, rows_a = rt.reshape(len(rt), -1), at.reshape(len(at), -1)
        same = [ctc_decode(x, role.blank) == ctc_decode(y, role.blank) for x, y in zip(rows_r, rows_a)]
        out["blank"] = role.blank
        out["string_agreement"] = float(np.mean(same)) if same else 1.0
    return out


def failures(name: str, role: str | None, metrics: JsonObject, tolerance: Tolerance) -> list[str]:
    """Every way one output's role metrics break ``tolerance``, in plain words naming the output."""
    m, t = metrics, tolerance
    agree = 1.0 - t.max_top1_drop
    checks: list[tuple[str, str, float, bool]] = []  # (key, what, limit, larger is better)
    if role == Role.CLASSIFICATION:
        checks += [("top1_agreement", "top-1 agreement", agree, True),
                   ("decision_agreement", "decision agreement", agree, True)]
    elif role == Role.BOXES:
        checks += [("error_to_range", "largest error against its range", t.max_slice_error, False),
                   ("mean_iou", "mean box IoU", t.min_box_iou, True)]
    elif role == Role.LANDMARKS:
        checks.append(("error_to_spread", "RMS error against their spread", t.max_relative_error, False))
    elif role == Role.DENSE:
        if float(m.get("foreground_fraction", 1.0) or 0.0) >= segmentation.MIN_FOREGROUND:
            checks.append(("mean_iou", "mean IoU of the argmax map", t.min_mask_iou, True))
        if float(m.get("positive_fraction", 1.0) or 0.0) >= MIN_POSITIVES:
            checks.append(("iou", "IoU of the positions above 0.5", t.min_mask_iou, True))
        checks.append(("relative_error", "relative error", t.max_relative_error, False))
    elif role == Role.SEQUENCE:
        if "string_agreement" in m:
            checks.append(("string_agreement", "CTC-decoded string agreement", agree, True))
        else:
            checks.append(("step_agreement", "per-step top-1 agreement", agree, True))
    elif role == Role.EMBEDDING:
        checks.append(("mean_cosine", "mean per-vector cosine", t.min_cosine, True))
    elif role == Role.REGRESSION:
        if "component_error_to_spread" in m:
            checks.append(("component_error_to_spread", "worst component's RMS error against its spread",
                           t.max_relative_error, False))
        else:
            checks.append(("relative_error", "relative error", t.max_relative_error, False))
    elif role == Role.ORDINAL:
        checks.append(("decoded_error_bins_p95", "decoded value's error in bins (95th percentile)",
                       t.max_ordinal_error, False))
    elif role == Role.DETECTION_HEAD and int(m.get("float_detections") or 0) >= detection_head.MIN_DETECTIONS:
        checks += [("recall", "detection recall vs float", t.min_recall, True),
                   ("precision", "detection precision vs float", t.min_precision, True),
                   ("mean_iou", "mean IoU of the matched detections", t.min_detection_iou, True)]
    reasons = []
    for key, what, limit, larger in checks:
        value = m.get(key)
        if not isinstance(value, (int, float)):
            continue
        value = float(value)
        if not math.isfinite(value) or (value < limit - 1e-9 if larger else value > limit + 1e-9):
            reasons.append(f"{name} ({role}): {what} {value:.4f} {'<' if larger else '>'} {limit}"
                           + would_pass_hint(name, m))
    return reasons


def would_pass_hint(name: str, metrics: JsonObject) -> str:
    """For an inferred role: the role under which the artifact would pass, and what to declare."""
    other = metrics.get("would_pass_as")
    if not other:
        return ""
    declare = metrics.get("would_pass_declare") or f"{name}={other}"
    return (f"; the role was only inferred, and as {other} this output passes: if it carries {other} values, "
            f"declare --output-task {declare}")
