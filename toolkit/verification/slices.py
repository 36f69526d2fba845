"""Per-output error, and the split of an output whose channels carry quantities of very different ranges.

A detection head's final Concat puts box coordinates (0-320) and class scores (0-1) in one tensor; quantized
with one scale, the scores collapse to a couple of values while the whole-tensor cosine stays at 0.998. So
each output's channels (along whichever axis separates them best) are grouped by the order of magnitude of
their float range; when the groups span more than :data:`SPLIT_RATIO` the output is verified group by group,
each with its error relative to its own float range.
"""

from __future__ import annotations

import math

import numpy as np

from toolkit.model.records import OutputMetrics, SliceMetrics, runs_of, slice_label

SPLIT_RATIO = 100.0  # groups whose float ranges span more than this are verified one by one
GAP = 10.0  # channels whose ranges differ by more than this (sorted neighbours) start a new group
FOLD = 1e-4  # a group below this fraction of the largest range is folded into the next larger one
MAX_CHANNELS = 4096  # axes longer than this are positions, not channels (as are the H, W of a dense map)


def cosine(ref: np.ndarray, act: np.ndarray) -> float:
    r = np.ravel(ref).astype(np.float64)
    a = np.ravel(act).astype(np.float64)
    if not np.all(np.isfinite(a)):
        return float("nan")
    denom = float(np.linalg.norm(r) * np.linalg.norm(a))
    if denom == 0.0:
        return 1.0 if np.array_equal(r, a) else 0.0
    return float(np.dot(r, a) / denom)


def _range(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max() - finite.min()) if finite.size else 0.0


def channel_groups(ref: np.ndarray) -> tuple[int, list[list[int]]] | None:
    """(axis of one sample's array, groups of channel indices) when ``ref`` ([samples, ...]) mixes ranges
    more than :data:`SPLIT_RATIO` apart along some axis; None when it is one quantity."""
    from toolkit.verification.segmentation import class_axis

    best: tuple[float, int, list[list[int]]] | None = None
    dense = class_axis(ref.shape[1:])  # a dense map: rows and columns are places, only its classes are channels
    for axis, size in enumerate(ref.shape[1:]):
        if not 2 <= size <= MAX_CHANNELS or (dense is not None and axis != dense):
            continue
        rows = np.moveaxis(ref, axis + 1, 0).reshape(size, -1)
        ranges = np.ptp(np.where(np.isfinite(rows), rows, 0.0), axis=1)
        live = [i for i in range(size) if ranges[i] > 0]
        if len(live) < 2:
            continue
        live.sort(key=lambda i: ranges[i])
        groups: list[list[int]] = [[live[0]]]
        for prev, cur in zip(live, live[1:]):
            if ranges[cur] > GAP * ranges[prev]:
                groups.append([])
            groups[-1].append(cur)
        top = float(ranges[live[-1]])
        while len(groups) > 1 and float(max(ranges[i] for i in groups[0])) < FOLD * top:
            groups[1] = groups[0] + groups[1]
            groups.pop(0)
        if len(groups) < 2:
            continue
        spread = float(max(ranges[i] for i in groups[-1])) / float(max(ranges[i] for i in groups[0]))
        if spread > SPLIT_RATIO and (best is None or spread > best[0]):
            best = (spread, axis, [sorted(g) for g in groups])
    if best is None:
        return None
    # largest range first reads naturally (boxes, then scores)
    return best[1], sorted(best[2], key=lambda g: g[0])


def output_metrics(ref: np.ndarray, act: np.ndarray, *, name: str, index: int) -> OutputMetrics:
    """Whole-output error and, where :func:`channel_groups` splits it, per-slice error."""
    if ref.shape != act.shape:
        raise ValueError(f"output {name} has shape {act.shape[1:]} but the float model's is {ref.shape[1:]}")
    finite = bool(np.all(np.isfinite(act)))
    diff = np.abs(ref.astype(np.float64) - act.astype(np.float64)) if finite else None
    whole = OutputMetrics(
        name=name,
        index=index,
        max_abs_error=float(diff.max()) if diff is not None and diff.size else (0.0 if finite else math.nan),
        mean_abs_error=float(diff.mean()) if diff is not None and diff.size else (0.0 if finite else math.nan),
        cosine_similarity=cosine(ref, act),
        float_range=_range(ref),
    )
    split = channel_groups(ref)
    if split is None:
        return whole
    axis, groups = split
    slices = []
    for group in groups:
        take = np.asarray(group)
        r = np.take(ref, take, axis=axis + 1)
        d = np.take(diff, take, axis=axis + 1) if diff is not None else None
        runs = runs_of(group)
        slices.append(SliceMetrics(
            name=slice_label(name, axis, ref.ndim - 1, runs),
            axis=axis,
            runs=runs,
            float_range=_range(r),
            max_abs_error=float(d.max()) if d is not None else math.nan,
            mean_abs_error=float(d.mean()) if d is not None else math.nan,
        ))
    return OutputMetrics(whole.name, whole.index, whole.max_abs_error, whole.mean_abs_error,
                         whole.cosine_similarity, whole.float_range, tuple(slices))
