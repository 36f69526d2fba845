"""Weight clustering (sharing): each conv/dense kernel is reduced to N shared values by 1-D k-means (linear
initialisation between the kernel's min and max, as tfmot does). A kernel that already holds exact zeros
(pruned before) keeps them as one of its N values, so pruning survives clustering. With training data the
model is fine-tuned; after every update each weight goes back to its cluster, whose value becomes the mean of
its members (the assignment is fixed, the centroids learn), so the weights never leave N values.
Float files do not shrink; the gzip size (and an int8/palette encoding downstream) does.
"""

from __future__ import annotations


import numpy as np

from toolkit.errors import UsageError
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.training import FineTuneConfig, fine_tune
from toolkit.optimization.weights import WeightRef, prunable_weights


def check_clusters(clusters: int) -> None:
    if clusters < 2:
        raise UsageError(f"Weight clustering needs at least 2 clusters, got {clusters}.",
                         hint="Pass e.g. --cluster 16.")


def kmeans_1d(values: np.ndarray, clusters: int, *, iterations: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Centroids (sorted) and each value's cluster index."""
    low, high = float(values.min()), float(values.max())
    centroids = np.linspace(low, high, clusters) if high > low else np.full(clusters, low)
    assignment = np.zeros(values.size, dtype=np.int64)
    for _ in range(iterations):
        assignment = _nearest(values, centroids)
        sums = np.bincount(assignment, weights=values, minlength=clusters)
        counts = np.bincount(assignment, minlength=clusters)
        updated = np.where(counts > 0, sums / np.maximum(counts, 1), centroids)
        if np.allclose(updated, centroids):
            break
        centroids = updated
    order = np.argsort(centroids)
    rank = np.empty_like(order)
    rank[order] = np.arange(clusters)
    return centroids[order], rank[_nearest(values, centroids)]


def _nearest(values: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    nearest: np.ndarray = np.abs(values[:, None] - centroids[None, :]).argmin(axis=1)
    return nearest


class _Clustered:
    """One kernel's cluster assignment; zeros (if kept) are cluster -1."""

    def __init__(self, ref: WeightRef, clusters: int) -> None:
        self.ref = ref
        weights = ref.get()
        flat = weights.reshape(-1)
        self.shape = weights.shape
        zeros = flat == 0
        self.keep_zeros = bool(zeros.mean() >= 0.01)
        self.count = clusters - 1 if self.keep_zeros else clusters
        nonzero = flat[~zeros] if self.keep_zeros else flat
        self.index = np.full(flat.size, -1, dtype=np.int64)
        # A kernel that pruning zeroed entirely (global pruning does that to small-magnitude layers) has nothing
        # to cluster: it stays all zeros. One with fewer distinct nonzero values than clusters keeps them as they
        # are (k-means with more centroids than values would only leave some empty).
        self.count = min(max(1, self.count), int(np.unique(nonzero).size))
        centroids, assignment = (kmeans_1d(nonzero, self.count) if self.count > 0
                                 else (np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int64)))
        if self.keep_zeros:
            self.index[~zeros] = assignment
        else:
            self.index[:] = assignment
        self.centroids = centroids
        self.write()

    def refit(self) -> None:
        """Centroids become the mean of their members' current (trained) values."""
        flat = self.ref.get().reshape(-1)
        members = self.index >= 0
        sums = np.bincount(self.index[members], weights=flat[members], minlength=self.centroids.size)
        counts = np.bincount(self.index[members], minlength=self.centroids.size)
        self.centroids = np.where(counts > 0, sums / np.maximum(counts, 1), self.centroids)
        self.write()

    def write(self) -> None:
        if self.centroids.size == 0:  # nothing but zeros: the kernel stays as pruning left it
            values = np.zeros(self.index.size, dtype=np.float32)
        else:
            values = np.where(self.index >= 0, self.centroids[np.maximum(self.index, 0)], 0.0)
        self.ref.set(values.reshape(self.shape).astype(np.float32))


def cluster(model: models.OptimizableModel, *, clusters: int, train_data: LabelledData | None,
            config: FineTuneConfig) -> dict[str, object]:
    """Cluster every kernel of ``model`` in place; returns the distinct values per kernel."""
    check_clusters(clusters)
    refs = prunable_weights(model)
    if not refs:
        raise UsageError("The model has no conv or dense kernels to cluster.")
    states = [_Clustered(ref, clusters) for ref in refs]
    if train_data is not None and config.epochs > 0:
        def after_update(_update: int) -> None:
            for state in states:
                state.refit()

        fine_tune(model, train_data, config=config, after_update=after_update)
        for state in states:
            state.refit()
    return {
        "clusters": clusters,
        "distinct_values": {r.name: int(np.unique(r.get()).size) for r in refs},
        "zeros_kept": {s.ref.name: s.keep_zeros for s in states if s.keep_zeros},
        "left_as_is": [s.ref.name for s in states if s.count == 0],
    }
