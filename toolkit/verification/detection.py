"""Detection metrics: decode boxes and scores, keep detections above a score threshold, match the artifact's
to the float model's at IoU >= 0.5 (same class), and report recall and precision against the float model.

Two layouts are read:

* YOLO-style: one head ``[1, 4+C, N]`` (or ``[1, N, 4+C]``): per anchor ``cx, cy, w, h`` in pixels then C
  class scores in [0, 1] (Ultralytics' exported head). Detections are NMS-filtered per class (IoU 0.5) and
  matched greedily by IoU.
* SSD-style: separate outputs ``boxes [1, N, K>=4]`` and ``scores [1, N, C]`` over the same N anchors
  (MediaPipe's BlazeFace: regressors ``[1, 896, 16]``, classificators ``[1, 896, 1]``). Box values are offsets
  from each anchor, read as ``cx, cy, w, h``; without the anchor table the detections are matched anchor by
  anchor (IoU of the two boxes of the same anchor, which equals their IoU once decoded). Scores outside [0, 1]
  are logits and go through a sigmoid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IOU = 0.5
YOLO_SCORE_THRESHOLD = 0.25  # Ultralytics' default conf
SSD_SCORE_THRESHOLD = 0.5  # MediaPipe's min_score_thresh
MIN_DETECTIONS = 10  # fewer float detections over the eval set say nothing about recall
MAX_CANDIDATES = 300  # per sample and class, before NMS


@dataclass(frozen=True)
class SsdLayout:
    boxes: int  # output index
    scores: int
    anchors: int


@dataclass(frozen=True)
class DetectionMetrics:
    recall: float
    precision: float
    float_detections: int
    artifact_detections: int
    matched: int
    score_threshold: float
    layout: str  # "yolo" or "ssd"

    def to_dict(self) -> dict[str, float | int | str]:
        return {"recall": self.recall, "precision": self.precision, "float_detections": self.float_detections,
                "artifact_detections": self.artifact_detections, "matched": self.matched,
                "score_threshold": self.score_threshold, "iou": IOU, "layout": self.layout}


def _sample_matrix(stacked: np.ndarray) -> np.ndarray:
    """[samples, ...] with batch dims of 1 dropped -> [samples, A, B] (None-safe for rank checks)."""
    shape = [d for d in stacked.shape[1:]]
    while len(shape) > 2 and shape[0] == 1:
        shape.pop(0)
    return stacked.reshape((stacked.shape[0], *shape))


def yolo_layout(stacked: np.ndarray) -> int | None:
    """The channel axis (1 or 2 of the ``[samples, A, B]`` view) of a YOLO-style head, else None."""
    m = _sample_matrix(stacked)
    if m.ndim != 3 or not np.all(np.isfinite(m)):
        return None
    for axis in (1, 2):
        channels, anchors = m.shape[axis], m.shape[3 - axis]
        if not 5 <= channels <= 1004 or anchors < max(16, 2 * channels):
            continue
        rows = np.moveaxis(m, axis, 1)  # [samples, channels, anchors]
        scores = rows[:, 4:, :]
        boxes = rows[:, :4, :]
        if scores.min() < -1e-3 or scores.max() > 1 + 1e-3:
            continue
        box_range = float(np.ptp(boxes))
        if box_range > 10.0 * max(float(np.ptp(scores)), 1e-6) and box_range > 2.0:
            return axis
    return None


def ssd_layout(stacked: Sequence[np.ndarray], names: Sequence[str] = ()) -> SsdLayout | None:
    """Two outputs over the same anchors: boxes (the wider one, or the one named box/regress/loc) and scores."""
    views = [_sample_matrix(s) for s in stacked]
    candidates = [i for i, v in enumerate(views) if v.ndim == 3 and v.shape[1] >= 16]
    for i in candidates:
        for j in candidates:
            if i == j or views[i].shape[1] != views[j].shape[1]:
                continue
            wide, narrow = views[i].shape[2], views[j].shape[2]
            name_i = names[i].lower() if i < len(names) else ""
            name_j = names[j].lower() if j < len(names) else ""
            named = any(k in name_i for k in ("box", "regress", "loc")) and any(
                k in name_j for k in ("score", "class", "conf", "logit"))
            if wide >= 4 and (named or (wide > narrow and narrow >= 1)):
                return SsdLayout(boxes=i, scores=j, anchors=views[i].shape[1])
    return None


def _xyxy(cxcywh: np.ndarray) -> np.ndarray:
    cx, cy, w, h = (cxcywh[..., k] for k in range(4))
    w, h = np.abs(w), np.abs(h)
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    x1 = np.maximum(box[0], boxes[:, 0])
    y1 = np.maximum(box[1], boxes[:, 1])
    x2 = np.minimum(box[2], boxes[:, 2])
    y2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _nms(boxes: np.ndarray, scores: np.ndarray) -> list[int]:
    order = list(np.argsort(-scores, kind="stable")[:MAX_CANDIDATES])
    keep: list[int] = []
    while order:
        i = order.pop(0)
        keep.append(i)
        if order:
            rest = np.asarray(order)
            order = [k for k, o in zip(rest, _iou(boxes[i], boxes[rest])) if o < IOU]
    return keep


def _detections(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[tuple[int, np.ndarray, float]]:
    """(class, box xyxy, score) after per-class NMS; ``boxes [N, 4]`` xyxy, ``scores [N, C]``."""
    found = []
    for c in range(scores.shape[1]):
        idx = np.nonzero(scores[:, c] > threshold)[0]
        if idx.size == 0:
            continue
        for k in _nms(boxes[idx], scores[idx, c]):
            found.append((c, boxes[idx[k]], float(scores[idx[k], c])))
    return found


def _match(ref: list[tuple[int, np.ndarray, float]], act: list[tuple[int, np.ndarray, float]]) -> int:
    """Greedy one-to-one matching, the artifact's detections by descending score."""
    used = [False] * len(ref)
    matched = 0
    for c, box, _ in sorted(act, key=lambda d: -d[2]):
        best, best_iou = -1, IOU
        for k, (rc, rbox, _) in enumerate(ref):
            if used[k] or rc != c:
                continue
            overlap = float(_iou(box, rbox[None, :])[0])
            if overlap >= best_iou:
                best, best_iou = k, overlap
        if best >= 0:
            used[best] = True
            matched += 1
    return matched


def _metrics(matched: int, n_ref: int, n_act: int, threshold: float, layout: str) -> DetectionMetrics:
    recall = matched / n_ref if n_ref else (1.0 if n_act == 0 else 0.0)
    precision = matched / n_act if n_act else (1.0 if n_ref == 0 else 0.0)
    return DetectionMetrics(recall, precision, n_ref, n_act, matched, threshold, layout)


def yolo_metrics(ref: np.ndarray, act: np.ndarray, *, axis: int, threshold: float | None = None) -> DetectionMetrics:
    """Recall/precision of the artifact's YOLO-style detections against the float model's, over all samples."""
    threshold = YOLO_SCORE_THRESHOLD if threshold is None else threshold
    r = np.moveaxis(_sample_matrix(ref), axis, 2)  # [samples, anchors, 4+C]
    a = np.moveaxis(_sample_matrix(act), axis, 2)
    n_ref = n_act = matched = 0
    for s in range(r.shape[0]):
        ref_dets = _detections(_xyxy(r[s, :, :4]), r[s, :, 4:], threshold)
        act_dets = _detections(_xyxy(a[s, :, :4]), np.nan_to_num(a[s, :, 4:], nan=0.0), threshold)
        n_ref, n_act = n_ref + len(ref_dets), n_act + len(act_dets)
        matched += _match(ref_dets, act_dets)
    return _metrics(matched, n_ref, n_act, threshold, "yolo")


def label_boxes(labels: np.ndarray | None, samples: int) -> list[list[tuple[int, np.ndarray, float]]] | None:
    """Eval labels as boxes, when ``y`` is ``[samples, K, 5]`` rows of (class, cx, cy, w, h) in the head's
    frame, padded with rows whose class is negative; None for any other labels."""
    if labels is None:
        return None
    y = np.asarray(labels)
    if y.ndim != 3 or y.shape[0] != samples or y.shape[2] != 5 or not np.issubdtype(y.dtype, np.number):
        return None
    return [[(int(row[0]), _xyxy(row[1:5].astype(np.float64)), 1.0) for row in sample if row[0] >= 0]
            for sample in y]


def label_metrics(heads: np.ndarray, *, axis: int, truth: list[list[tuple[int, np.ndarray, float]]],
                  threshold: float | None = None) -> tuple[float, float]:
    """(recall, precision) of a YOLO-style model's detections against labelled boxes."""
    threshold = YOLO_SCORE_THRESHOLD if threshold is None else threshold
    rows = np.moveaxis(_sample_matrix(heads), axis, 2)
    matched = found = total = 0
    for s in range(rows.shape[0]):
        dets = _detections(_xyxy(rows[s, :, :4]), np.nan_to_num(rows[s, :, 4:], nan=0.0), threshold)
        matched += _match(truth[s], dets)
        found += len(dets)
        total += len(truth[s])
    return (matched / total if total else 1.0), (matched / found if found else (1.0 if total == 0 else 0.0))


def _probabilities(scores: np.ndarray, logits: bool) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(scores, -60, 60))) if logits else scores


def ssd_metrics(ref: Sequence[np.ndarray], act: Sequence[np.ndarray], *, layout: SsdLayout,
                threshold: float | None = None) -> DetectionMetrics:
    """Anchor-by-anchor recall/precision of SSD-style outputs against the float model's."""
    threshold = SSD_SCORE_THRESHOLD if threshold is None else threshold
    rb, ab = _sample_matrix(ref[layout.boxes]), _sample_matrix(act[layout.boxes])
    rs, as_ = _sample_matrix(ref[layout.scores]), _sample_matrix(act[layout.scores])
    logits = bool(rs.min() < -1e-3 or rs.max() > 1 + 1e-3)
    rp, ap = _probabilities(rs, logits), _probabilities(np.nan_to_num(as_, nan=-1e9), logits)
    ref_on, act_on = rp > threshold, ap > threshold  # [samples, anchors, classes]
    both = ref_on & act_on
    rbox, abox = _xyxy(rb[..., :4]), _xyxy(np.nan_to_num(ab[..., :4]))
    x1 = np.maximum(rbox[..., 0], abox[..., 0])
    y1 = np.maximum(rbox[..., 1], abox[..., 1])
    x2 = np.minimum(rbox[..., 2], abox[..., 2])
    y2 = np.minimum(rbox[..., 3], abox[..., 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    union = ((rbox[..., 2] - rbox[..., 0]) * (rbox[..., 3] - rbox[..., 1])
             + (abox[..., 2] - abox[..., 0]) * (abox[..., 3] - abox[..., 1]) - inter)
    iou = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)  # [samples, anchors]
    matched = int(np.sum(both & (iou[..., None] >= IOU)))
    return _metrics(matched, int(ref_on.sum()), int(act_on.sum()), threshold, "ssd")
