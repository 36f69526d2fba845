"""Whether keeping a set of nodes float can bring an INT8 artifact back, by the error locator's own measurement;
selective quantization tries only the sets that can, and stops when none can (fail fast).

Each measured node carries its own error: the error it adds in full INT8 (ONNX: ``node_locator``) or its
layer-table row's channel error (the other routes: ``layers``). Taking the nodes' errors as independent noise,
a float set removes its nodes' share of the summed squared error. A set is worth a rebuild when

* what stays outside it is at most ``RETRY_REMAINS`` of the error (RMS): the rebuild can change the verdict;
* and it removes error out of proportion to its size (``OUT_OF_PROPORTION`` x its share of the measured
  nodes): where the error is spread evenly, every set removes about its own share, and only keeping most
  of the model float would pass, which is the fp16/fp32 fallback's job, not a retry's.

Issue 34: a 0.49 M-parameter CNN took 626 s to convert for three formats, each INT8 retried 4-5 times
against a metric it could not pass; the plain paths took about 30 s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from toolkit.model.quantized import names_layer

RETRY_REMAINS = 0.5  # a float set must leave at most this fraction of the measured error (RMS)
OUT_OF_PROPORTION = 1.5  # ... and remove at least this many times its share of the measured nodes


@dataclass(frozen=True)
class Worth:
    """What keeping one float set would leave of the measured error, and whether that is worth a rebuild."""

    removed: float  # the share of the summed squared error the set's nodes hold
    remaining: float  # sqrt(1 - removed): the RMS error left, relative to the full INT8's
    share: float  # the set's share of the measured nodes
    measured: int  # how many nodes carry a measured error

    @property
    def worth(self) -> bool:
        if self.measured == 0:
            return True  # nothing measured: no grounds to skip the rebuild
        return self.remaining <= RETRY_REMAINS and self.removed >= OUT_OF_PROPORTION * self.share

    def why_not(self) -> str:
        """Why the set is not worth a rebuild ("" when it is)."""
        if self.worth:
            return ""
        if self.remaining > RETRY_REMAINS:
            return (f"keeping it float would leave {100 * self.remaining:.0f}% of the measured error "
                    f"(at most {100 * RETRY_REMAINS:.0f}% can pass)")
        return (f"it holds {100 * self.share:.0f}% of the measured nodes and {100 * self.removed:.0f}% of the "
                "error: the error is spread, not where a float set removes it")


def weigh(errors: Mapping[str, float], group: Sequence[str]) -> Worth:
    """``group`` (``nodes_to_exclude`` names) weighed against ``errors`` (measured node -> its own error)."""
    live = {name: value for name, value in errors.items() if math.isfinite(value)}
    total = sum(value * value for value in live.values())
    if not live or total <= 0:
        return Worth(0.0, 1.0, 0.0, 0)
    names = set(group)
    inside = [name for name in live if names_layer(name, names)]
    removed = min(sum(live[name] ** 2 for name in inside) / total, 1.0)
    return Worth(removed, math.sqrt(1.0 - removed), len(inside) / len(live), len(live))


def spread_summary(errors: Mapping[str, float]) -> str:
    """One line on how the measured error is distributed: the worst node's share and how many nodes carry it."""
    live = sorted(((v * v, n) for n, v in errors.items() if math.isfinite(v) and v > 0), reverse=True)
    total = sum(v for v, _ in live)
    if not live or total <= 0:
        return "no node error was measured"
    half = next(i + 1 for i, _ in enumerate(live) if sum(v for v, _ in live[:i + 1]) >= total / 2)
    return (f"the worst node ({live[0][1]}) holds {100 * live[0][0] / total:.0f}% of the squared error; "
            f"half of it takes {half} of {len(errors)} measured nodes")
