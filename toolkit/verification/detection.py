"""Detection metrics: decode boxes and scores, keep detections above a score threshold, match the artifact's
to the float model's at IoU >= 0.5 (same class), and report recall and precision against the float model.

Two layouts, YOLO-style (one head ``[1, 4+C, N]``, NMS per class) and SSD-style (``boxes`` and ``scores`` over
the same anchors, matched anchor by anchor; logits get a sigmoid). Against labelled boxes the artifact's loss is
gated against the float model's own score, not an absolute figure: how good the float model is against the
labels is the user's business, what the conversion lost is ours. Layouts, label format and anchor tables
(:class:`AnchorTable`, :data:`SCHEMES`): docs/verification.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toolkit.errors import UsageError

IOU = 0.5
YOLO_SCORE_THRESHOLD = 0.25  # Ultralytics' default conf
SSD_SCORE_THRESHOLD = 0.5  # MediaPipe's min_score_thresh
MIN_DETECTIONS = 10  # fewer float detections over the eval set say nothing about recall
MAX_CANDIDATES = 300  # per sample and class, before NMS
MAX_BOX_VALUES = 4 + 2 * 21  # a box per anchor, maybe followed by key points (BlazeFace: 4 + 6 x 2)


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


def _box_output(view: np.ndarray, named: bool) -> bool:
    """Box coordinates per anchor: 4 values (or 4 plus x, y key points, offsets outside [0, 1]) per anchor.
    A map of probabilities over the same axis as another is a dense map, not boxes."""
    width = view.shape[2]
    if width == 4:
        return True
    if not 4 < width <= MAX_BOX_VALUES or width % 2:
        return False
    bounded = bool(np.all(np.isfinite(view)) and view.min() >= -1e-3 and view.max() <= 1 + 1e-3)
    return named or not bounded


def ssd_layout(stacked: Sequence[np.ndarray], names: Sequence[str] = ()) -> SsdLayout | None:
    """Two outputs over the same anchors that decode: boxes (4 coordinates per anchor, maybe followed by key
    points; the wider output, or the one named box/regress/loc) and scores (probabilities or logits per
    anchor, narrower, or named score/class/conf/logit)."""
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
            if _box_output(views[i], named) and (named or (wide > narrow and narrow >= 1)):
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


def _nms(boxes: np.ndarray, scores: np.ndarray, iou: float = IOU) -> list[int]:
    order = list(np.argsort(-scores, kind="stable")[:MAX_CANDIDATES])
    keep: list[int] = []
    while order:
        i = order.pop(0)
        keep.append(i)
        if order:
            rest = np.asarray(order)
            order = [k for k, o in zip(rest, _iou(boxes[i], boxes[rest])) if o < iou]
    return keep


def _detections(boxes: np.ndarray, scores: np.ndarray, threshold: float,
                *, nms_iou: float = IOU) -> list[tuple[int, np.ndarray, float]]:
    """(class, box xyxy, score) after per-class NMS; ``boxes [N, 4]`` xyxy, ``scores [N, C]``."""
    found = []
    for c in range(scores.shape[1]):
        idx = np.nonzero(scores[:, c] > threshold)[0]
        if idx.size == 0:
            continue
        for k in _nms(boxes[idx], scores[idx, c], nms_iou):
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


SSD_NMS_IOU = 0.3  # MediaPipe's min_suppression_threshold for its face and palm detectors


@dataclass(frozen=True)
class SsdAnchorScheme:
    """MediaPipe's ``SsdAnchorsCalculator`` options for detectors with a fixed anchor size (BlazeFace, the
    palm detector): one anchor centre per feature-map cell, ``2 * layers`` anchors per cell for each run of
    layers sharing a stride (aspect ratio 1 plus the interpolated one), anchor width and height 1 (the whole
    input); box offsets are in input pixels (``x_scale = y_scale = w_scale = h_scale`` = the input size)."""

    name: str
    input_size: tuple[int, int]  # (height, width) in pixels
    strides: tuple[int, ...]
    anchor_offset: float = 0.5

    def __post_init__(self) -> None:
        if len(self.input_size) != 2 or min(self.input_size) < 1 or not self.strides or min(self.strides) < 1:
            raise ValueError(f"anchor scheme {self.name!r}: input_size (h, w) and strides must be positive")

    def centres(self) -> np.ndarray:
        """``[N, 2]`` anchor centres (x, y), normalised to [0, 1], in MediaPipe's order."""
        height, width = self.input_size
        rows: list[np.ndarray] = []
        layer = 0
        while layer < len(self.strides):
            stride = self.strides[layer]
            repeats = 0
            while layer < len(self.strides) and self.strides[layer] == stride:
                repeats += 2
                layer += 1
            fh, fw = -(-height // stride), -(-width // stride)
            ys, xs = np.mgrid[0:fh, 0:fw].astype(np.float64)
            cells = np.stack([(xs.ravel() + self.anchor_offset) / fw, (ys.ravel() + self.anchor_offset) / fh], axis=1)
            rows.append(np.repeat(cells, repeats, axis=0))
        return np.concatenate(rows)

    def table(self) -> AnchorTable:
        """The anchors in the input's pixel frame (the frame labels are given in)."""
        height, width = self.input_size
        c = self.centres()
        rows = np.stack([c[:, 0] * width, c[:, 1] * height, np.ones(len(c)), np.ones(len(c))], axis=1)
        return AnchorTable(rows, source=f"{self.name} (MediaPipe SsdAnchorsCalculator: {height}x{width} input, "
                                        f"strides {','.join(map(str, self.strides))}, fixed anchor size)")


@dataclass(frozen=True)
class AnchorTable:
    """Per anchor ``cx, cy, sx, sy``: a box regressed as offsets ``dx, dy, w, h`` decodes to centre
    ``(cx + dx * sx, cy + dy * sy)`` and size ``(w * sx, h * sy)`` in the labels' frame."""

    rows: np.ndarray  # [N, 4]
    source: str  # where it came from, for the manifest

    def decode(self, offsets: np.ndarray) -> np.ndarray:
        """``[..., N, >=4]`` offsets -> ``[..., N, 4]`` boxes ``cx, cy, w, h``."""
        r = self.rows
        return np.stack([r[:, 0] + offsets[..., 0] * r[:, 2], r[:, 1] + offsets[..., 1] * r[:, 3],
                         offsets[..., 2] * r[:, 2], offsets[..., 3] * r[:, 3]], axis=-1)


# Models recognised by their outputs: (anchors, box values per anchor) -> scheme. BlazeFace short range:
# 128x128 input, 896 anchors, 16 values (box + 6 key points).
SCHEMES: dict[tuple[int, int], SsdAnchorScheme] = {
    (896, 16): SsdAnchorScheme("mediapipe-face-short-range", (128, 128), (8, 16, 16, 16)),
}


def anchor_table(declared: np.ndarray | None, layout: SsdLayout, box_values: int) -> AnchorTable | None:
    """The declared table (checked against the model's anchor count), else a known scheme's, else None."""
    if declared is not None:
        rows = np.asarray(declared, dtype=np.float64)
        if rows.shape != (layout.anchors, 4):
            raise UsageError(f"The eval data's anchors array is {list(rows.shape)}; the model has {layout.anchors} "
                             "anchors.", hint=f"Give anchors shaped [{layout.anchors}, 4]: cx, cy, sx, sy per anchor "
                                              "(docs/verification.md).")
        return AnchorTable(rows, source="declared with the eval data (anchors)")
    scheme = SCHEMES.get((layout.anchors, box_values))
    return scheme.table() if scheme is not None else None


def ssd_detections(outputs: Sequence[np.ndarray], *, layout: SsdLayout, anchors: AnchorTable,
                   threshold: float | None = None, logits: bool | None = None
                   ) -> list[list[tuple[int, np.ndarray, float]]]:
    """Per sample: (class, box xyxy in the labels' frame, score) of an SSD model, decoded and NMS-filtered."""
    threshold = SSD_SCORE_THRESHOLD if threshold is None else threshold
    boxes = anchors.decode(np.nan_to_num(_sample_matrix(outputs[layout.boxes]).astype(np.float64)))
    scores = _sample_matrix(outputs[layout.scores]).astype(np.float64)
    if logits is None:
        logits = bool(scores.min() < -1e-3 or scores.max() > 1 + 1e-3)
    probs = _probabilities(np.nan_to_num(scores, nan=-1e9), logits)
    return [_detections(_xyxy(boxes[s]), probs[s], threshold, nms_iou=SSD_NMS_IOU) for s in range(boxes.shape[0])]


def yolo_detections(heads: np.ndarray, *, axis: int, threshold: float | None = None
                    ) -> list[list[tuple[int, np.ndarray, float]]]:
    """Per sample: (class, box xyxy, score) of a YOLO-style head after per-class NMS."""
    threshold = YOLO_SCORE_THRESHOLD if threshold is None else threshold
    rows = np.moveaxis(_sample_matrix(heads), axis, 2)
    return [_detections(_xyxy(rows[s, :, :4]), np.nan_to_num(rows[s, :, 4:], nan=0.0), threshold)
            for s in range(rows.shape[0])]


@dataclass(frozen=True)
class LabelMetrics:
    """Recall and precision of one model's detections against the labelled boxes (IoU 0.5, same class)."""

    recall: float
    precision: float
    labelled: int
    detections: int
    matched: int


def score_against(truth: list[list[tuple[int, np.ndarray, float]]],
                  found: list[list[tuple[int, np.ndarray, float]]]) -> LabelMetrics:
    matched = sum(_match(t, d) for t, d in zip(truth, found))
    total, dets = sum(len(t) for t in truth), sum(len(d) for d in found)
    return LabelMetrics(recall=matched / total if total else 1.0,
                        precision=matched / dets if dets else (1.0 if total == 0 else 0.0),
                        labelled=total, detections=dets, matched=matched)
