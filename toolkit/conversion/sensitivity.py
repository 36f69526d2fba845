"""Which layers lose most in int8, and what keeping one float takes: the measures every route's layer table
(``toolkit.conversion.layers``) shares.

Why not the quantizers' own per-layer numbers: an activation with one outlier channel gets a per-tensor int8
scale set by that outlier, so every other channel collapses to a few levels; but the rounding error *in
quantization steps* (the TFLite debugger's RMSE / scale) stays at the usual ~0.3, and a relative L2 error over
the whole tensor is dominated by the outlier channel. Both rank such a layer last. So:

* ``ChannelError`` (~1: the channel is lost; a healthy layer a few percent) ranks the layers (one debug run).
* ``float_group``: a tensor stays float only when its producer *and* its consumers are float (a quantized consumer
  re-quantizes it with the same outlier-dominated range), so a layer is kept float with its consumers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

DEBUG_SAMPLES = 16  # calibration samples of the per-layer debug run
Row = tuple[str, str, float, float, "float | None", tuple[str, ...]]  # a layer table's row: name, op, channel error,
# range error, sqnr, float group (ranked into layers.LayerError)
SIGNAL_FLOOR = 1e-6  # a channel whose float RMS is below this fraction of the tensor's largest carries nothing

Group = tuple[str, ...]


@dataclass
class ChannelError:
    """Accumulates per-channel squared float values and squared errors of one tensor over samples."""

    axis: int = -1
    signal: np.ndarray | None = None
    noise: np.ndarray | None = None
    samples: int = 0
    bad_shape: bool = field(default=False)

    def add(self, reference: np.ndarray, actual: np.ndarray) -> None:
        with np.errstate(all="ignore"):
            ref = np.asarray(reference, dtype=np.float64)
            act = np.asarray(actual, dtype=np.float64)
        if ref.shape != act.shape or ref.ndim == 0:
            self.bad_shape = True
            return
        # The TFLite debugger's float copy of the last op sometimes reads back a few garbage elements (NaN):
        # leave them out rather than lose the layer.
        finite = np.isfinite(ref) & np.isfinite(act)
        if not np.all(finite):
            ref, act = np.where(finite, ref, 0.0), np.where(finite, act, 0.0)
        axis = self.axis % ref.ndim
        others = tuple(i for i in range(ref.ndim) if i != axis)
        signal = np.sum(ref * ref, axis=others)
        noise = np.sum((act - ref) ** 2, axis=others)
        if self.signal is None or self.noise is None:
            self.signal, self.noise = signal, noise
        elif self.signal.shape == signal.shape:
            self.signal, self.noise = self.signal + signal, self.noise + noise
        else:
            self.bad_shape = True
            return
        self.samples += 1

    def score(self) -> float:
        """Median over live channels of RMS(error) / RMS(float); NaN when nothing was measured."""
        if self.bad_shape or self.signal is None or self.noise is None:
            return math.nan
        live = self.signal > (SIGNAL_FLOOR**2) * max(float(self.signal.max()), 1e-30)
        if not np.any(live):
            return math.nan
        return float(np.median(np.sqrt(self.noise[live] / self.signal[live])))


def float_group(
    node: str,
    consumers: Mapping[str, Sequence[str]],
    passthrough: Callable[[str], bool],
    *,
    limit: int = 8,
) -> Group:
    """``node`` and what reads its output: data-movement nodes (``passthrough``: reshape, pooling...) are
    followed to the compute nodes behind them, which would otherwise re-quantize the tensor."""
    group = [node]
    frontier = list(consumers.get(node, ()))
    while frontier and len(group) < limit:
        current = frontier.pop(0)
        if current in group:
            continue
        group.append(current)
        if passthrough(current):
            frontier.extend(consumers.get(current, ()))
    return tuple(group)
