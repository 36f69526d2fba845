"""Which load options paid on the device: read from a ``check --loads`` report, never guessed.

The runner measures each ONNX Runtime session option (``session.use_env_allocators`` with an allocator
registered on the environment, the CPU memory arena off, ``session.use_device_allocator_for_initializers``,
pre-packing off) against the default session in interleaved rounds of fresh processes, and reports per side the
median and the [min, max] of the load time, the first inference and the peak RSS (docs/loading.md). An option
*pays* for a metric when every round with it beat every round without it (the ranges do not overlap: with 3
rounds a side, chance alone does that 1 time in 20) and the median gain is at least 10% (and 1 ms or 1 MiB).
Anything less is within the device's noise and is not suggested.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any  # Any: JSON values of a report's loads entry

METRICS = (("load_ms", "load", "ms"), ("first_inference_ms", "first inference", "ms"), ("peak_rss_mb", "peak RSS", "MiB"))
MIN_GAIN = 0.10
MIN_ABSOLUTE = 1.0  # ms or MiB


@dataclass(frozen=True)
class LoadAdvice:
    """One option that paid for one metric on the device: the medians without and with it."""

    option: str
    metric: str  # "load" | "first inference" | "peak RSS"
    unit: str
    before: float
    after: float

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else float("nan")

    def words(self) -> str:
        return (f"{self.option}: {self.metric} {self.before:.1f} -> {self.after:.1f} {self.unit} "
                f"({self.ratio:.2f}x)")


def _range(entry: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    value = entry.get(f"{key}_range")
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return float(value[0]), float(value[1])
    return None


def paying_options(loads: Mapping[str, Any] | None) -> tuple[LoadAdvice, ...]:
    """Every (option, metric) of ``loads`` (a report's ``loads`` entry) whose gain is beyond the noise."""
    found = []
    for option in (loads or {}).get("options") or []:
        before, after = option.get("before") or {}, option.get("after") or {}
        if before.get("error") or after.get("error"):
            continue
        for key, metric, unit in METRICS:
            spans = _range(before, key), _range(after, key)
            b, a = before.get(key), after.get(key)
            if spans[0] is None or spans[1] is None or not isinstance(b, (int, float)) or not isinstance(a, (int, float)):
                continue  # an option measured once (no rounds) gives no spread to judge against
            separated = spans[1][1] < spans[0][0]
            if separated and a <= b * (1 - MIN_GAIN) and b - a >= MIN_ABSOLUTE:
                found.append(LoadAdvice(str(option.get("name")), metric, unit, float(b), float(a)))
    return tuple(found)
