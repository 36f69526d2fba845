"""Raw detector heads: one output of boxes and scores per anchor, before NMS (:mod:`toolkit.model.heads`).

Whole-tensor error is the wrong judge of such a head: its thousands of background cells dominate the cosine,
while what the task keeps is the few boxes above the score threshold. So both the float model's head and the
artifact's are decoded the same way (boxes as the layout says, score = objectness x class or class, threshold,
class-aware NMS) and the artifact's detections are matched to the float model's (same class, IoU >= 0.5):
recall, precision and the mean IoU of the matches are what the tolerance gates.

The layout is inferred from the float values (:func:`infer`) and the evidence is written beside it: which axis
holds 4+C or 4+1+C channels against many more anchors, whether column 4 fires together with a class column
(objectness) or alone (a class), whether the scores are probabilities or logits and how sparse, whether the
box columns follow the anchor's position (boxes in the input's frame) or not (raw grid offsets and log sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolkit.model.heads import BoxEncoding, HeadLayout, HeadSpec
from toolkit.model.records import JsonDict, JsonObject

SCORE_THRESHOLD = 0.25  # Ultralytics' default conf
NMS_IOU = 0.5
MATCH_IOU = 0.5
MIN_DETECTIONS = 10  # fewer float detections over the eval set say nothing about recall
MAX_CANDIDATES = 300  # per sample, before NMS
MAX_CHANNELS = 4 + 1 + 1000
MIN_ANCHORS = 64
SPARSE = 0.3  # inferred without a task: the best score above 0.5 at no more than this share of the anchors
COFIRE = 0.5  # column 4 is objectness when a class column is above 0.5 with it at this share of its anchors
TREND = 0.8  # boxes in the input's frame: the centre's y follows the anchor's grid row (mean correlation)
LEVELS = (3, 1, 2, 4)  # grid levels tried for N anchors, strides doubling (YOLOX/v5/v8 have 3)


@dataclass(frozen=True)
class Head:
    """A raw head's layout as decoded, and why."""

    layout: HeadLayout
    boxes: BoxEncoding
    logits: bool  # the score columns get a sigmoid
    classes: int
    grid: tuple[tuple[int, int], ...]  # GRID boxes: (rows, cols) per level, finest first; () otherwise
    evidence: str

    def to_dict(self) -> JsonDict:
        return {"layout": self.layout.value, "boxes": self.boxes.value, "classes": self.classes,
                "scores": "logits (sigmoid)" if self.logits else "probabilities",
                "grid": " + ".join(f"{h}x{w}" for h, w in self.grid) or None}


def _matrix(stacked: np.ndarray) -> np.ndarray | None:
    """``[samples, ...]`` with leading axes of 1 dropped -> ``[samples, A, B]``, else None."""
    shape = list(stacked.shape[1:])
    while len(shape) > 2 and shape[0] == 1:
        shape.pop(0)
    return stacked.reshape((stacked.shape[0], *shape)) if len(shape) == 2 else None


def _rows(m: np.ndarray, layout: HeadLayout) -> np.ndarray:
    """``[samples, N, 4(+1)+C]`` whatever the layout."""
    return np.swapaxes(m, 1, 2) if layout.channels_first else m


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


def grid_levels(anchors: int) -> tuple[tuple[int, int], ...]:
    """Square grids, strides doubling, that hold exactly ``anchors`` cells (8400 = 80² + 40² + 20²); ()."""
    for levels in LEVELS:
        share = sum(4.0 ** -k for k in range(levels))
        side = int(round((anchors / share) ** 0.5))
        if side % 2 ** (levels - 1) == 0 and sum((side >> k) ** 2 for k in range(levels)) == anchors:
            return tuple((side >> k, side >> k) for k in range(levels))
    return ()


def _channel_layouts(shape: tuple[int, ...]) -> list[HeadLayout]:
    """The layouts whose channel axis fits: 5..1005 channels against at least 4x as many (and 64) anchors."""
    found: list[tuple[int, HeadLayout]] = []
    for layout, channels, anchors in ((HeadLayout.N_4C, shape[2], shape[1]), (HeadLayout.C4_N, shape[1], shape[2])):
        if 5 <= channels <= MAX_CHANNELS and anchors >= max(MIN_ANCHORS, 4 * channels):
            found.append((channels, layout))
    return [layout for _, layout in sorted(found, key=lambda f: f[0])]


def _objectness(p: np.ndarray) -> tuple[bool, str]:
    """Whether column 4 (``p[..., 0]``) is objectness: a class column fires with it (YOLOv5/X), where a
    class of its own fires alone (YOLOv8)."""
    if p.shape[-1] < 2:
        return False, "no column after column 4"
    hot = p[..., 0] > 0.5
    if hot.sum() < 3:
        return False, f"column 4 is above 0.5 at {int(hot.sum())} anchors (too few to tell objectness)"
    share = float(np.mean(p[..., 1:].max(axis=-1)[hot] > 0.5))
    what = "objectness" if share >= COFIRE else "a class of its own"
    return share >= COFIRE, (f"column 4 is above 0.5 at {int(hot.sum())} anchors and a later column is above 0.5 "
                             f"with it at {share:.0%} of them: {what}")


def _encoding(rows: np.ndarray) -> tuple[BoxEncoding, str]:
    """How the box columns read: in the input's frame (column 1, the centre's or top edge's y, follows the
    anchor's grid row) as corners or centre and size, else raw grid offsets and log sizes. The row is the
    cell's on the square grids that hold N anchors, else the anchor index."""
    grid = grid_levels(rows.shape[1])
    position = _cells(grid, rows.shape[1])[:, 1] if grid else np.arange(rows.shape[1], dtype=np.float64)
    what = "grid row" if grid else "index"
    trends = [float(np.corrcoef(position, r[:, 1])[0, 1]) for r in rows if np.ptp(r[:, 1]) > 0]
    trend = float(np.mean(trends)) if trends else 0.0
    if trend >= TREND:
        corners = bool(np.all(rows[..., 2] >= rows[..., 0]) and np.all(rows[..., 3] >= rows[..., 1]))
        return (BoxEncoding.XYXY if corners else BoxEncoding.CXCYWH,
                f"column 1 follows the anchor's {what} (correlation {trend:.2f}): boxes in the input's frame, "
                + ("x2 >= x1 and y2 >= y1 everywhere (corners)" if corners else "centre and size"))
    return BoxEncoding.GRID, (f"column 1 does not follow the anchor's {what} (correlation {trend:.2f} < {TREND}): "
                              "raw grid offsets and log sizes")


def infer(stacked: np.ndarray, *, spec: HeadSpec | None = None, loose: bool = False) -> Head | None:
    """The raw head ``stacked`` (``[samples, ...]`` float values) looks like, with the evidence; None.

    Inferred on its own (neither ``spec``, the user's declaration, nor ``loose``, a ``--task detection``), a head
    needs probability scores, sparse (the best above 0.5 at <= 30% of the anchors), and box columns outside
    [0, 1]; declared or under ``--task detection`` logits are read through a sigmoid."""
    m = _matrix(stacked)
    if m is None or not np.all(np.isfinite(m)):
        return None
    declared = spec is not None
    given = spec or HeadSpec()
    layouts = [given.layout] if given.layout is not None else _channel_layouts(m.shape)
    for layout in layouts:
        rows = _rows(m, layout).astype(np.float64)
        anchors, channels = rows.shape[1:]
        if channels < 5 or anchors < channels:  # a declared layout on the wrong axis decodes as nothing
            continue
        scores = rows[..., 4:]
        probabilities = bool(scores.min() >= -1e-3 and scores.max() <= 1 + 1e-3)
        if not probabilities and not (declared or loose):
            continue
        p = scores if probabilities else _sigmoid(scores)
        objectness, why_obj = (layout.objectness, "declared") if given.layout is not None \
            else _objectness(p) if layout is HeadLayout.N_4C else (False, "channels first")
        if objectness:
            layout = HeadLayout.N_5C
        best = p[..., 0] if objectness else p.max(axis=-1)
        firing = float(np.mean(best > 0.5))
        boxes = rows[..., :4]
        outside = bool(boxes.min() < -1e-3 or boxes.max() > 1 + 1e-3)
        if not (declared or loose) and (firing > SPARSE or not outside):
            continue
        encoding, why_box = (given.boxes, "declared") if given.boxes is not None else _encoding(rows)
        grid = grid_levels(anchors) if encoding is BoxEncoding.GRID else ()
        if encoding is BoxEncoding.GRID and not grid:
            if not declared:
                continue
            why_box += f"; {anchors} anchors fill no square grid: they are placed in one row (NMS merges neighbours)"
        elif grid:
            why_box += f"; {anchors} anchors = " + " + ".join(f"{h}x{w}" for h, w in grid) + " cells"
        classes = channels - 4 - int(objectness)
        evidence = (f"a raw detector head {list(stacked.shape[1:])} ({layout.value}: {anchors} anchors of "
                    f"{channels} values, {classes} class(es)); {why_obj}; scores are "
                    f"{'probabilities' if probabilities else 'logits'}, the best above 0.5 at {firing:.1%} of "
                    f"the anchors; box columns span [{boxes.min():.3g}, {boxes.max():.3g}], {why_box}")
        return Head(layout, encoding, not probabilities, classes, grid, evidence)
    return None


def _cells(grid: tuple[tuple[int, int], ...], anchors: int) -> np.ndarray:
    """``[N, 3]``: each anchor's cell column, row and stride (the finest level's stride is 1), row-major."""
    if not grid:
        return np.stack([np.arange(anchors, dtype=np.float64), np.zeros(anchors), np.ones(anchors)], axis=1)
    parts = []
    for level, (rows, cols) in enumerate(grid):
        ys, xs = np.mgrid[0:rows, 0:cols].astype(np.float64)
        parts.append(np.stack([xs.ravel(), ys.ravel(), np.full(rows * cols, 2.0 ** level)], axis=1))
    return np.concatenate(parts)


def decode(stacked: np.ndarray, head: Head) -> tuple[np.ndarray, np.ndarray]:
    """Boxes ``[samples, N, 4]`` (x1, y1, x2, y2) and scores ``[samples, N, C]`` of a head's values."""
    m = _matrix(np.nan_to_num(np.asarray(stacked, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0))
    assert m is not None, "decode() takes the outputs infer() read as a head"
    rows = _rows(m, head.layout)
    p = _sigmoid(rows[..., 4:]) if head.logits else rows[..., 4:]
    scores = p[..., :1] * p[..., 1:] if head.layout.objectness else p
    b = rows[..., :4]
    if head.boxes is BoxEncoding.XYXY:
        return b, scores
    if head.boxes is BoxEncoding.GRID:
        cells = _cells(head.grid, rows.shape[1])
        centre = (cells[:, :2] + b[..., :2]) * cells[:, 2:]
        size = np.exp(np.clip(b[..., 2:], -20.0, 20.0)) * cells[:, 2:]
    else:
        centre, size = b[..., :2], np.abs(b[..., 2:])
    return np.concatenate([centre - size / 2, centre + size / 2], axis=-1), scores


def pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[len(a), len(b)]`` IoU of xyxy boxes."""
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0.0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0.0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0.0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


@dataclass(frozen=True)
class Detections:
    """One sample's detections after NMS, by descending score."""

    boxes: np.ndarray  # [K, 4] xyxy
    classes: np.ndarray  # [K]
    scores: np.ndarray  # [K]


def detect(boxes: np.ndarray, scores: np.ndarray, threshold: float = SCORE_THRESHOLD) -> Detections:
    """One sample: each anchor's best class above ``threshold``, then class-aware greedy NMS at ``NMS_IOU``."""
    best, cls = scores.max(axis=-1), scores.argmax(axis=-1)
    idx = np.nonzero(best > threshold)[0]
    idx = idx[np.argsort(-best[idx], kind="stable")][:MAX_CANDIDATES]
    b, c = boxes[idx], cls[idx]
    over = (pairwise_iou(b, b) > NMS_IOU) & (c[:, None] == c[None, :])
    keep = np.ones(len(idx), bool)
    for i in range(len(idx)):
        if keep[i]:
            keep[i + 1:] &= ~over[i, i + 1:]
    return Detections(b[keep], c[keep], best[idx][keep])


def match(ref: Detections, act: Detections) -> tuple[int, float]:
    """Greedy one-to-one matching of the artifact's detections (by descending score) to the float model's,
    same class, IoU >= ``MATCH_IOU``: (matches, sum of their IoU)."""
    iou = pairwise_iou(act.boxes, ref.boxes) * (act.classes[:, None] == ref.classes[None, :])
    used = np.zeros(len(ref.scores), bool)
    matched, total = 0, 0.0
    for row in iou:
        free = np.where(used, -1.0, row)
        j = int(np.argmax(free)) if free.size else -1
        if j >= 0 and free[j] >= MATCH_IOU:
            used[j] = True
            matched, total = matched + 1, total + float(free[j])
    return matched, total


def metrics(ref: np.ndarray, act: np.ndarray, head: Head, threshold: float = SCORE_THRESHOLD) -> JsonDict:
    """The artifact's detections against the float model's over all samples, both decoded by ``head``."""
    (rb, rs), (ab, as_) = decode(ref, head), decode(act, head)
    n_ref = n_act = matched = 0
    iou_sum = 0.0
    for s in range(rb.shape[0]):
        r, a = detect(rb[s], rs[s], threshold), detect(ab[s], as_[s], threshold)
        hits, total = match(r, a)
        n_ref, n_act, matched, iou_sum = n_ref + len(r.scores), n_act + len(a.scores), matched + hits, iou_sum + total
    return {"recall": matched / n_ref if n_ref else (1.0 if n_act == 0 else 0.0),
            "precision": matched / n_act if n_act else (1.0 if n_ref == 0 else 0.0),
            "mean_iou": iou_sum / matched if matched else (1.0 if n_ref == n_act == 0 else 0.0),
            "float_detections": n_ref, "artifact_detections": n_act, "matched": matched,
            "score_threshold": threshold, "nms_iou": NMS_IOU, "match_iou": MATCH_IOU, **head.to_dict()}


def too_few(name: str, found: JsonObject) -> str | None:
    """Why a head's metrics prove nothing: the float model detects too little over the eval set."""
    count = found.get("float_detections")
    if isinstance(count, int) and count < MIN_DETECTIONS:
        return (f"{name}: the float model makes {count} detection(s) over the eval set at score > "
                f"{found.get('score_threshold')}: recall needs at least {MIN_DETECTIONS}")
    return None
