"""Ordinal outputs: a row of ordered bins (360 pitch bins of 20 cents, angle, age or depth bins) whose value is
read around the peak, not as a class.

The value is decoded the way such models decode it themselves (CREPE's local average): the activation-weighted
mean of the bin indices within :data:`WINDOW` bins of the argmax. An artifact is judged by how far its decoded
value moves from the float model's, in bins (and in the bin's unit where declared), over the rows where the float
model is confident (its peak at least half the largest peak over the eval set): an unvoiced frame's pitch is
noise in both. Inference (:func:`evidence`) reads the shape of the activations: in an ordinal histogram the
second-highest bin sits beside the highest and the neighbours carry a large share of the peak; in a
classifier they do not.
"""

from __future__ import annotations

import numpy as np

from toolkit.model.records import JsonDict

WINDOW = 4  # bins either side of the peak that the weighted mean reads
MIN_BINS = 16  # fewer ordered bins are read as classes
ADJACENT_SHARE = 0.7  # the second-highest bin beside the highest in at least this share of the rows
NEIGHBOUR_RATIO = 0.3  # and the neighbours' mean activation at least this fraction of the peak


def decode(rows: np.ndarray) -> np.ndarray:
    """``[n, K]`` activations -> ``[n]`` fractional bin indices (weighted mean within WINDOW of the argmax)."""
    bins = rows.shape[-1]
    peak = np.argmax(rows, axis=-1)
    offsets = np.arange(-WINDOW, WINDOW + 1)
    index = np.clip(peak[:, None] + offsets[None, :], 0, bins - 1)
    weights = np.clip(np.take_along_axis(rows, index, axis=-1), 0.0, None)
    inside = (peak[:, None] + offsets[None, :] >= 0) & (peak[:, None] + offsets[None, :] < bins)
    weights = weights * inside
    total = weights.sum(axis=-1)
    mean = (weights * index).sum(axis=-1) / np.where(total > 0, total, 1.0)
    return np.where(total > 0, mean, peak.astype(np.float64))


def evidence(rows: np.ndarray) -> str | None:
    """Why ``[n, K]`` non-negative activations look like an ordinal histogram (None when they do not)."""
    if rows.ndim != 2 or rows.shape[-1] < MIN_BINS or rows.shape[0] < 2 or rows.min() < -1e-3:
        return None
    rows = rows[confident(rows)]
    order = np.argsort(rows, axis=-1)
    first, second = order[:, -1], order[:, -2]
    adjacent = float(np.mean(np.abs(first - second) == 1))
    padded = np.pad(rows, ((0, 0), (1, 1)))
    peak = np.take_along_axis(rows, first[:, None], axis=-1)[:, 0]
    left = np.take_along_axis(padded, first[:, None], axis=-1)[:, 0]
    right = np.take_along_axis(padded, first[:, None] + 2, axis=-1)[:, 0]
    ratio = float(np.mean((left + right) / 2 / np.where(peak > 0, peak, 1.0)))
    if adjacent < ADJACENT_SHARE or ratio < NEIGHBOUR_RATIO:
        return None
    return (f"{rows.shape[-1]} ordered bins: the second-highest bin is beside the highest in {adjacent:.0%} of "
            f"the {len(rows)} confident rows and the neighbours carry {ratio:.2f} of the peak (an ordinal histogram, decoded around "
            "its peak)")


def confident(rows: np.ndarray) -> np.ndarray:
    """The rows whose peak is at least half the largest peak (where the decoded value means something)."""
    peaks = rows.max(axis=-1)
    return peaks >= 0.5 * float(peaks.max()) if peaks.size else np.zeros(0, bool)


def metrics(ref: np.ndarray, act: np.ndarray, *, bin_size: float | None = None, unit: str | None = None) -> JsonDict:
    """The decoded value's error of ``act`` against ``ref`` (``[samples, ..., K]``) over the confident rows."""
    r, a = ref.reshape(-1, ref.shape[-1]), act.reshape(-1, act.shape[-1])
    sure = confident(r)
    error = np.abs(decode(r[sure]) - decode(a[sure])) if sure.any() else np.zeros(0)
    out: JsonDict = {
        "bins": int(r.shape[-1]),
        "confident_rows": int(sure.sum()),
        "decoded_error_bins_p95": float(np.percentile(error, 95)) if error.size else 0.0,
        "decoded_error_bins_max": float(error.max()) if error.size else 0.0,
        "decoded_error_bins_median": float(np.median(error)) if error.size else 0.0,
        "top1_bin_agreement": float(np.mean(np.argmax(r, -1) == np.argmax(a, -1))) if len(r) else 1.0,
    }
    if bin_size is not None:
        label = unit or "units"
        out[f"decoded_error_{label}_p95"] = out["decoded_error_bins_p95"] * bin_size
        out[f"decoded_error_{label}_max"] = out["decoded_error_bins_max"] * bin_size
    return out
