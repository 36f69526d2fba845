"""Batch > 1 verification of a dynamic-batch artifact on the host, at convert time.

``convert --dynamic-batch`` promises that the artifact runs at any batch size, and batching must not change
any one sample's result: each sample's outputs at batch 4 and 8 are compared with its outputs at batch 1 (the
artifact against itself). An artifact that mixes samples across the batch (a normalization over the batch
axis, a dynamic quantizer scaled over the whole batch) or drops the batch dimension is then not ``ok``. The
limit is the runner's per-sample rule (docs/verification.md; at least 1e-4: kernels may sum in another order at
another batch size). Records are stdlib only; the check imports numpy inside.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.errors import key_line
from toolkit.model.records import JsonDict, JsonObject, finite_or_none
from toolkit.model.tensors import TensorSpec

BATCH_SIZES = (4, 8)
FIXED_BATCH_NOTE = ("the batch dimension is fixed in this artifact: --dynamic-batch did not apply to its route, "
                    "so it runs one sample per call")
RELATIVE_LIMIT = 1e-4  # of the output's largest magnitude at batch 1


@dataclass(frozen=True)
class BatchCheck:
    """One batch size: the worst difference of any sample's output from its batch-1 output, and the limit."""

    batch: int
    max_abs_error: float
    limit: float
    output: str | None = None  # the output where the worst difference is, when there is one

    @property
    def ok(self) -> bool:
        return math.isfinite(self.max_abs_error) and self.max_abs_error <= self.limit

    def to_dict(self) -> JsonDict:
        return {"batch": self.batch, "max_abs_error": finite_or_none(self.max_abs_error), "limit": self.limit,
                "output": self.output, "ok": self.ok}


@dataclass(frozen=True)
class BatchVerification:
    """Per-sample outputs at each batch size against batch 1; ``problem`` says why a size could not run."""

    checks: tuple[BatchCheck, ...]
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and all(c.ok for c in self.checks)

    def failures(self) -> list[str]:
        """Each way batching changed a sample's result, in plain words; empty when it did not."""
        found = [f"at batch {c.batch} a sample's output {c.output!r} differs from its batch-1 output by "
                 f"{c.max_abs_error:.3g} (limit {c.limit:.3g}): batching changes each sample's result (an operation "
                 "across the batch axis, or a dynamic quantizer whose scale is taken over the whole batch)"
                 for c in self.checks if not c.ok]
        return found + ([self.problem] if self.problem else [])

    def to_dict(self) -> JsonDict:
        return {"checks": [c.to_dict() for c in self.checks], "problem": self.problem, "ok": self.ok}


Infer = Callable[[JsonObject], Sequence[Any]]  # numpy arrays in and out (Any: numpy is imported inside)


def verify_batches(infer: Infer, feeds: Sequence[JsonObject], single: Sequence[Sequence[Any]], *,  # Any: arrays
                   output_names: Sequence[str], steps: Sequence[float] = (), sizes: Sequence[int] = BATCH_SIZES,
                   ) -> BatchVerification:
    """Run ``infer`` on batches of ``sizes`` built from the batch-1 ``feeds`` (cycled when there are fewer) and
    compare each sample's outputs with ``single`` (the same artifact's outputs for each feed at batch 1).
    ``steps``: the quantization step of each output (0 for a float output)."""
    import numpy as np

    count = len(feeds)
    if count == 0:
        return BatchVerification((), "no held-out samples to build a batch from")
    limits = []
    for k in range(len(output_names)):
        largest = max(float(np.max(np.abs(np.asarray(outs[k], np.float64)))) if np.asarray(outs[k]).size else 0.0
                      for outs in single)
        step = float(steps[k]) if k < len(steps) else 0.0
        limits.append(RELATIVE_LIMIT * max(1.0, largest if math.isfinite(largest) else 1.0) + step * 1.0001)
    checks: list[BatchCheck] = []
    for batch in sizes:
        rows = [i % count for i in range(batch)]
        feed = {name: np.concatenate([np.asarray(feeds[i][name]) for i in rows], axis=0) for name in feeds[0]}
        try:
            outputs = [np.asarray(o) for o in infer(feed)]
        except Exception as exc:  # noqa: BLE001 - the runtime refuses this batch size: the artifact's failure
            return BatchVerification(tuple(checks), f"the artifact does not run at batch {batch}: "
                                     f"{type(exc).__name__}: {key_line(exc)}")
        worst = (-1.0, 0.0, "", 0.0)  # (error / limit, error, output, limit)
        for k, name in enumerate(output_names):
            out = outputs[k]
            if out.ndim == 0 or out.shape[0] != batch:
                return BatchVerification(tuple(checks), f"output {name!r} has shape {list(out.shape)} at batch "
                                         f"{batch}: it does not keep the batch dimension, so its samples cannot "
                                         "be told apart")
            for j, i in enumerate(rows):
                want = np.asarray(single[i][k], np.float64).reshape(-1)
                got = out[j].astype(np.float64).reshape(-1)
                if want.size != got.size:
                    error = float("inf")
                else:
                    error = float(np.max(np.abs(got - want))) if want.size else 0.0
                ratio = error / limits[k] if math.isfinite(error) else float("inf")
                if not ratio <= worst[0]:  # NaN and inf take the place too
                    worst = (ratio, error, name, limits[k])
                if not math.isfinite(ratio):
                    break
        _, error, where, limit = worst
        checks.append(BatchCheck(batch=batch, max_abs_error=error, limit=limit, output=where or None))
    return BatchVerification(tuple(checks))


def batch_is_dynamic(specs: Sequence[TensorSpec]) -> bool:
    """Every input has a dynamic first dimension (None or negative)."""
    return bool(specs) and all(s.shape and (s.shape[0] is None or s.shape[0] < 0) for s in specs)


def output_step(spec: TensorSpec) -> float:
    """The quantization step of an integer output; 0 for a float one."""
    quantization = spec.quantization
    if quantization is None or not quantization.scale or "int" not in str(spec.dtype):
        return 0.0
    return float(max(quantization.scale))
