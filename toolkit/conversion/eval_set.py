"""What ``edgetk convert --device-eval N`` writes into a bundle: ``eval/`` (the first N held-out inputs, the
float model's outputs for them and their labels). :mod:`toolkit.checks.device_eval` runs it on a device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from toolkit.delivery.bundle import EVAL_DIR, EVAL_LABELS, EVAL_REFERENCE, save_npz


def write_eval_set(staging: Path, *, feeds: Sequence[Mapping[str, np.ndarray]], input_names: Sequence[str],
                   reference: Sequence[Sequence[np.ndarray]], labels: np.ndarray | None, limit: int) -> str:
    """Write ``eval/`` for the first ``limit`` held-out samples; the note for the manifest's record."""
    count = min(limit, len(feeds), len(reference))
    folder = staging / EVAL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    size = 0
    for i, name in enumerate(input_names):
        stacked = np.stack([np.asarray(feed[name], dtype=np.float32) for feed in feeds[:count]])
        np.save(folder / f"input_{i}.npy", stacked, allow_pickle=False)
        size += stacked.nbytes
    outputs = {f"output_{k}": np.stack([np.asarray(r[k], dtype=np.float32) for r in reference[:count]])
               for k in range(len(reference[0]))} if count else {}
    save_npz(staging / EVAL_REFERENCE, outputs)
    if labels is not None:
        np.save(staging / EVAL_LABELS, np.asarray(labels)[:count], allow_pickle=False)
    return (f"eval set for `edgetk check --eval`: {count} samples ({size / 1e6:.2f} MB of inputs; "
            f"{'with' if labels is not None else 'without'} labels) in {EVAL_DIR}/")
