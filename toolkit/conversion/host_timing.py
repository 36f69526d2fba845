"""What host latency may say about an artifact: only a profile that IS this host lets it decide anything.

The host is not the device: a ``raspberry-pi-4`` bundle built on an x86 laptop used to mark full-INT8 TFLite
``slower`` (INT8 is slower on x86 without VNNI, while a Cortex-A72 runs it with XNNPACK's int8 kernels,
findings.md section 6); and one median per artifact, minutes apart, flipped a model's INT8 between ``slower``
and preferred with only another job's load changed. So for another CPU the latency is recorded, labelled with
the host CPU, and decides nothing (the device chooses: ``toolkit.checks.selection``); for the profile that
matches this machine (``generic-x86_64`` on x86-64, ``local``) the artifact is timed against fp32 of its
format in alternating rounds in one process and judged with the regression gate's statistics
(:mod:`toolkit.regression`). A difference inside the noise is :attr:`Speed.NO_SPEEDUP`, never ``slower``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

import numpy as np

from toolkit.model.policy import RegressionPolicy
from toolkit.regression import Difference, compare, median

Infer = Callable[[Mapping[str, np.ndarray]], object]
HOST_PROFILES = ("local",)  # profile names that mean "this machine" besides the one matching it
# The paired comparison's thresholds: the regression gate's own (alpha 0.01, 25% and 0.2 ms). Smaller minimum
# effects let the host's load decide: a 10%/0.02 ms rule flipped a ~0.03 ms model's INT8 between preferred and
# not under a CPU hog (benchmarks/selection.py), because a hog scales every absolute difference.
PAIRED = RegressionPolicy()
ROUNDS = 12  # alternating rounds
PER_ROUND = 3  # timed runs per side per round


class Speed(StrEnum):
    """What the paired comparison with fp32 found (on the host profile only)."""

    FASTER = "faster"
    SLOWER = "slower"
    NO_SPEEDUP = "no_speedup_measured"  # inside the noise: neither faster nor slower


@lru_cache(maxsize=1)
def host_cpu() -> str:
    """This host's CPU model, as the device probe names it (the label on every host latency)."""
    from toolkit.model.platform import probe_local

    arch, cpu, _ = probe_local()
    return f"{cpu or 'unknown CPU'} ({arch})"


@lru_cache(maxsize=8)
def is_this_host(profile: str) -> bool:
    """Whether ``profile`` is this machine: the shipped profile that matches it, or ``local``; a profile naming a
    device kind (``raspberry-pi-4``, a user's board) is not, even on the same arch."""
    from toolkit.errors import ToolkitError
    from toolkit.model.platform import host_profile_name

    if profile in HOST_PROFILES:
        return True
    try:
        return profile == host_profile_name()
    except ToolkitError:  # an arch with no shipped profile: nothing here is "this host"
        return False


@dataclass(frozen=True)
class PairedTiming:
    """Both sides' samples (ms) from alternating rounds in one process, and the verdict."""

    candidate_ms: tuple[float, ...]
    fp32_ms: tuple[float, ...]
    speed: Speed
    p_slower: float
    p_faster: float

    @property
    def candidate_p50(self) -> float:
        return median(self.candidate_ms)

    @property
    def fp32_p50(self) -> float:
        return median(self.fp32_ms)

    def describe(self, runtime: str) -> str:
        ratio = self.candidate_p50 / self.fp32_p50 if self.fp32_p50 > 0 else float("inf")
        words = {Speed.FASTER: "faster than", Speed.SLOWER: "slower than",
                 Speed.NO_SPEEDUP: "no speedup measured over"}[self.speed]
        return (f"{words} fp32 in {runtime} on this host ({self.candidate_p50:.3f} ms vs {self.fp32_p50:.3f} ms, "
                f"{ratio:.2f}x, paired over {len(self.candidate_ms)} alternating runs each; "
                f"p={min(self.p_slower, self.p_faster):.2g})")


def judge(candidate: Sequence[float], fp32: Sequence[float], policy: RegressionPolicy | None = None) -> PairedTiming:
    """Faster, slower, or inside the noise: the regression gate's test both ways (:func:`regression.compare`)."""
    policy = policy or PAIRED
    difference, p_slower, p_faster = compare(candidate, fp32, alpha=policy.alpha, min_pct=policy.min_slowdown_pct,
                                             min_ms=policy.min_slowdown_ms)
    speed = {Difference.SLOWER: Speed.SLOWER, Difference.FASTER: Speed.FASTER, Difference.SAME: Speed.NO_SPEEDUP}
    return PairedTiming(tuple(candidate), tuple(fp32), speed[difference], p_slower, p_faster)


def paired(candidate: Infer, fp32: Infer, feed: Mapping[str, np.ndarray], *, rounds: int = ROUNDS,
           per_round: int = PER_ROUND, warmup: int = 3, budget_s: float = 4.0) -> PairedTiming:
    """Time ``candidate`` and ``fp32`` in alternating rounds (which goes first alternates too), then judge."""
    for _ in range(warmup):
        candidate(feed)
        fp32(feed)
    sides: tuple[list[float], list[float]] = ([], [])
    runners = (candidate, fp32)
    start = time.perf_counter()
    for index in range(rounds):
        order = (0, 1) if index % 2 == 0 else (1, 0)
        for side in order:
            for _ in range(per_round):
                begin = time.perf_counter()
                runners[side](feed)
                sides[side].append((time.perf_counter() - begin) * 1000.0)
        if index >= 3 and time.perf_counter() - start > budget_s:  # a slow model: fewer rounds, still paired
            break
    return judge(sides[0], sides[1])


def paired_with_fp32(fp32_path: object, *, threads: int, source_inputs: Sequence[object], candidate: Infer,
                     feed: Mapping[str, np.ndarray], align: Callable[..., list[int]]) -> PairedTiming | None:
    """:func:`paired` against the fp32 artifact at ``fp32_path``, opened again in this process (``align``:
    ``candidate.align``); None when it cannot be opened (then nothing is compared)."""
    from pathlib import Path

    from toolkit.runtimes.execution import open_session

    try:
        session = open_session(Path(str(fp32_path)), threads=threads)
    except Exception:  # noqa: BLE001 - no fp32 to pair with: the artifact is simply not compared
        return None
    try:
        order = align(source_inputs, session.inputs, what="input")

        def fp32(values: Mapping[str, np.ndarray]) -> object:
            return session.run({session.inputs[j].name: values[spec.name]  # type: ignore[attr-defined]
                                for spec, j in zip(source_inputs, order)})

        return paired(candidate, fp32, feed)
    finally:
        session.close()
