"""Magnitude pruning: zero the smallest weights of conv and dense kernels (unstructured), globally or per
layer, to a target sparsity. With training data the model is fine-tuned while the sparsity ramps up on a
polynomial schedule (tfmot's PolynomialDecay: ``s_t = s * (1 - (1 - t/T)^3)``, masks recomputed every few
updates, pruned weights kept at zero after every update); the last mask is the target one.

Structured pruning (filters and channels removed, layers rebuilt smaller) lives in ``structured.py``.
"""

from __future__ import annotations

import math

import numpy as np

from toolkit.errors import UsageError
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.training import FineTuneConfig, fine_tune
from toolkit.optimization.weights import WeightRef, prunable_weights

SCOPES = ("global", "layer")


def check_sparsity(sparsity: float) -> None:
    if not 0.0 < sparsity < 1.0:
        raise UsageError(f"Sparsity must lie strictly between 0 and 1, got {sparsity}.",
                         hint="Pass e.g. --prune 0.5 to zero half of the conv and dense weights.")


def keep_channels(norms: np.ndarray, sparsity: float) -> np.ndarray:
    """The channels with the largest L1 norms, leaving out ``ceil(sparsity * n)`` of them (at least one kept)."""
    count = norms.size
    remove = min(count - 1, math.ceil(sparsity * count))
    return np.sort(np.argsort(-norms, kind="stable")[: count - remove])


def keep_masks(arrays: list[np.ndarray], sparsity: float, scope: str) -> list[np.ndarray]:
    """Boolean keep-masks that zero exactly ceil(sparsity * n) smallest-magnitude weights (of all kernels
    together for ``global``, of each kernel for ``layer``)."""
    if scope == "layer":
        return [_mask_smallest(np.abs(a).reshape(-1), math.ceil(sparsity * a.size)).reshape(a.shape)
                for a in arrays]
    flat = np.concatenate([np.abs(a).reshape(-1) for a in arrays])
    keep = _mask_smallest(flat, math.ceil(sparsity * flat.size))
    masks, offset = [], 0
    for a in arrays:
        masks.append(keep[offset:offset + a.size].reshape(a.shape))
        offset += a.size
    return masks


def _mask_smallest(magnitudes: np.ndarray, count: int) -> np.ndarray:
    keep = np.ones(magnitudes.size, dtype=bool)
    if count > 0:
        keep[np.argpartition(magnitudes, count - 1, kind="introselect")[:count]] = False
    return keep


def prune(model: models.OptimizableModel, *, sparsity: float, scope: str = "global",
          train_data: LabelledData | None, config: FineTuneConfig) -> dict[str, object]:
    """Prune ``model`` in place; returns the sparsity reached per kernel and over all kernels."""
    check_sparsity(sparsity)
    if scope not in SCOPES:
        raise UsageError(f"Unknown pruning scope {scope!r}.", hint="Pick 'global' or 'layer'.")
    refs = prunable_weights(model)
    if not refs:
        raise UsageError("The model has no conv or dense kernels to prune.")
    masks = _apply(refs, keep_masks([r.get() for r in refs], sparsity, scope) if not _will_train(train_data, config)
                   else [np.ones(r.get().shape, dtype=bool) for r in refs])
    if _will_train(train_data, config):
        assert train_data is not None
        total = config.updates(len(train_data))
        end = max(1, int(total * 0.7))
        frequency = max(1, total // 20)
        state = {"masks": masks}

        def after_update(update: int) -> None:
            if update % frequency == 0 or update == end:
                target = sparsity * (1.0 - (1.0 - min(update / end, 1.0)) ** 3)
                state["masks"] = keep_masks([r.get() for r in refs], target, scope)
            _apply(refs, state["masks"])

        fine_tune(model, train_data, config=config, after_update=after_update)
        masks = _apply(refs, keep_masks([r.get() for r in refs], sparsity, scope))
    zeros = [int(np.count_nonzero(r.get() == 0)) for r in refs]
    sizes = [int(r.get().size) for r in refs]
    return {
        "scope": scope,
        "target_sparsity": sparsity,
        "sparsity": round(sum(zeros) / sum(sizes), 4),
        "layers": {r.name: round(z / s, 4) for r, z, s in zip(refs, zeros, sizes)},
    }


def _will_train(train_data: LabelledData | None, config: FineTuneConfig) -> bool:
    return train_data is not None and config.epochs > 0


def _apply(refs: list[WeightRef], masks: list[np.ndarray]) -> list[np.ndarray]:
    for ref, mask in zip(refs, masks):
        ref.set(np.where(mask, ref.get(), 0.0))
    return masks
