"""Segmentation metrics: per-pixel agreement and IoU of the artifact's label map against the float model's.

A map with several class channels is reduced by argmax (mean IoU over the classes either map uses); a map
with one channel is a probability (or logit) mask, thresholded at 0.5 (logits at 0), and its foreground IoU is
the mask IoU (PP-OCR's text map, MediaPipe's selfie mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_SPATIAL = 16  # both spatial sides at least this
MAX_CLASSES = 256
MIN_FOREGROUND = 1e-3  # a float map with less of its second class than this (fraction of pixels) is vacuous


@dataclass(frozen=True)
class SegmentationMetrics:
    pixel_agreement: float
    mean_iou: float  # over classes; for one-channel masks the foreground IoU
    classes: int
    foreground_fraction: float  # the float map's pixels outside its most common class

    def to_dict(self) -> dict[str, float | int]:
        return {"pixel_agreement": self.pixel_agreement, "mean_iou": self.mean_iou, "classes": self.classes,
                "foreground_fraction": self.foreground_fraction}


def class_axis(shape: Sequence[int]) -> int | None:
    """The class axis of one sample's map ``[1, C, H, W]`` / ``[1, H, W, C]`` (or ``[C, H, W]`` without the
    batch), else None; a leading 1 of three axes is the batch."""
    dims = list(shape)
    offset = 0
    if len(dims) == 4 and dims[0] == 1:
        dims, offset = dims[1:], 1
    elif len(dims) == 3 and dims[0] == 1:
        return None  # [1, T, C]: the leading 1 is the batch axis, never a class axis (a CTC sequence)
    if len(dims) != 3:
        return None
    first, last = dims[0], dims[2]
    if last <= MAX_CLASSES and last < dims[0] and last < dims[1] and min(dims[0], dims[1]) >= MIN_SPATIAL:
        return offset + 2
    if first <= MAX_CLASSES and first < dims[1] and first < dims[2] and min(dims[1], dims[2]) >= MIN_SPATIAL:
        return offset
    return None


def label_maps(stacked: np.ndarray, axis: int, *, logits: bool | None = None) -> np.ndarray:
    """``[samples, H, W]`` integer maps of ``stacked`` ([samples, *one sample's shape]) along class ``axis``."""
    values = np.nan_to_num(stacked, nan=0.0)
    if values.shape[axis + 1] == 1:
        single = np.take(values, 0, axis=axis + 1)
        if logits is None:
            logits = bool(single.min() < -1e-3 or single.max() > 1 + 1e-3)
        maps = single > (0.0 if logits else 0.5)
    else:
        maps = np.argmax(values, axis=axis + 1)
    flat: np.ndarray = maps.reshape(maps.shape[0], -1).astype(np.int64)
    return flat


def segmentation_metrics(ref: np.ndarray, act: np.ndarray, *, axis: int) -> SegmentationMetrics:
    single = ref.shape[axis + 1] == 1
    logits = None
    if single:
        r = np.take(ref, 0, axis=axis + 1)
        logits = bool(r.min() < -1e-3 or r.max() > 1 + 1e-3)
    rm, am = label_maps(ref, axis, logits=logits), label_maps(act, axis, logits=logits)
    agreement = float(np.mean(rm == am))
    counts = np.bincount(rm.ravel())
    foreground = 1.0 - float(counts.max()) / float(rm.size) if rm.size else 0.0
    classes = [1] if single else sorted(set(np.unique(rm)) | set(np.unique(am)))
    ious = []
    for c in classes:
        inter = np.sum((rm == c) & (am == c))
        union = np.sum((rm == c) | (am == c))
        if union:
            ious.append(inter / union)
    mean_iou = float(np.mean(ious)) if ious else 1.0
    return SegmentationMetrics(agreement, mean_iou, 2 if single else ref.shape[axis + 1], foreground)
