"""The sizes of a staged rollout (``deploy --waves``, ``--max-failures``): parsed and checked at the boundary,
a record with no stage behind it, so that ``toolkit.model.options`` validates them without importing the rollout."""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.errors import UsageError


def _size(text: str, what: str) -> tuple[int | None, float | None]:
    """'5' -> (5, None); '10%' -> (None, 10.0)."""
    raw = text.strip()
    try:
        if raw.endswith("%"):
            pct = float(raw[:-1])
            if not 0 <= pct <= 100:
                raise ValueError
            return None, pct
        count = int(raw)
        if count < 0:
            raise ValueError
        return count, None
    except ValueError:
        raise UsageError(f"{what}: {text!r} is neither a device count nor a percentage from 0% to 100%.",
                         hint="Examples: --waves 1,10%,100%  --max-failures 5%  --max-failures 2") from None


@dataclass(frozen=True)
class WavePlan:
    """Batch sizes as given (``("1", "10%", "100%")``); the last repeats until the fleet is done."""

    sizes: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> WavePlan:
        sizes = tuple(s.strip() for s in text.split(",") if s.strip())
        if not sizes:
            raise UsageError("--waves needs at least one size, e.g. --waves 1,10%,100%.")
        for s in sizes:
            count, pct = _size(s, "--waves")
            if count == 0 or pct == 0:
                raise UsageError(f"--waves: a wave of {s} devices would never finish the rollout.")
        return cls(sizes)

    def batches(self, total: int) -> list[int]:
        """The wave sizes for a fleet of ``total`` devices (they add up to ``total``)."""
        out: list[int] = []
        left, index = total, 0
        while left > 0:
            count, pct = _size(self.sizes[min(index, len(self.sizes) - 1)], "--waves")
            size = count if count is not None else max(1, math.ceil(total * (pct or 0) / 100.0))
            out.append(min(size, left))
            left -= out[-1]
            index += 1
        return out


@dataclass(frozen=True)
class FailureLimit:
    """``--max-failures``: a count or a percentage of a wave; exceeded when MORE devices than that failed."""

    count: int | None = 0
    percent: float | None = None

    @classmethod
    def parse(cls, text: str) -> FailureLimit:
        count, pct = _size(text, "--max-failures")
        return cls(count, pct)

    def exceeded(self, failed: int, size: int) -> bool:
        if self.percent is not None:
            return size > 0 and 100.0 * failed / size > self.percent
        return failed > (self.count or 0)

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else str(self.count)
