"""The check policy: what ``edgetk check`` gates a bundle against, frozen into ``manifest.json`` at convert time.

Convert builds it from the target profile (:func:`toolkit.model.targets.check_policy_from_profile`); check gates
from the bundle alone, so a bundle built with a user's ``--targets-dir`` profile keeps its budget, regression
thresholds and placement expectations on every machine that checks it. A bundle written before the policy
existed has none: check says so in ``skipped`` notes instead of guessing from a profile name. Stdlib only.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from toolkit.errors import UsageError
from toolkit.model.reading import REQUIRED, Rule, check_rules
from toolkit.model.records import Record
from toolkit.model.vocabulary import Format

# Where a TFLite artifact's nodes can run besides the CPU kernels: the runner's names for its delegates.
TFLITE_PLACES: tuple[str, ...] = ("xnnpack", "edgetpu", "gpu")
# The ExecuTorch backend a .pte's nodes are delegated to (the rest run on ExecuTorch's portable kernels).
PTE_PLACES: tuple[str, ...] = ("xnnpack",)
_DELEGATES: Mapping[Format, tuple[str, tuple[str, ...]]] = {
    Format.TFLITE: ("a TFLite delegate", TFLITE_PLACES), Format.PTE: ("an ExecuTorch backend", PTE_PLACES)}
_FORMATS_HINT = f"Use one of: {', '.join(Format)}."


@dataclass(frozen=True)
class RegressionPolicy(Record):
    """When a check is a latency regression against the history of the same bundle, device and artifact
    (the three conditions and their defaults: docs/targets.md). The baseline pools the raw samples of the last
    ``baseline_checks`` passing checks, and the slowdown is measured from the slowest per-check median among them,
    because one runner process's median lands on one of two levels about 1.5x apart on shared VMs.
    """

    min_slowdown_pct: float = 25.0
    min_slowdown_ms: float = 0.2
    alpha: float = 0.01
    baseline_checks: int = 5
    min_baseline_checks: int = 5

    def __post_init__(self) -> None:
        if not self.min_slowdown_pct >= 0:
            raise UsageError(f"regression.min_slowdown_pct must be 0 or more (got {self.min_slowdown_pct}).")
        if not self.min_slowdown_ms >= 0:
            raise UsageError(f"regression.min_slowdown_ms must be 0 or more (got {self.min_slowdown_ms}).")
        if not 0 < self.alpha < 1:
            raise UsageError(f"regression.alpha must lie in (0, 1) (got {self.alpha}).", hint="0.01 is usual.")
        if self.baseline_checks < 1 or not 1 <= self.min_baseline_checks <= self.baseline_checks:
            raise UsageError(
                f"regression: need 1 <= min_baseline_checks <= baseline_checks (got {self.min_baseline_checks} "
                f"and {self.baseline_checks}).",
                hint="For example baseline_checks = 5, min_baseline_checks = 3.",
            )


@dataclass(frozen=True)
class PlacementExpectation(Record):
    """Where the nodes of an artifact must run: at least ``min_nodes_pct`` percent of them on ``on``.

    ``on`` is an ONNX Runtime execution provider (``TensorrtExecutionProvider``) for ONNX artifacts, a
    TFLite delegate (``edgetpu``, ``xnnpack``, ``gpu``) for TFLite ones, or the ExecuTorch backend (``xnnpack``)
    for .pte ones (the share of the program's operator nodes it took, counted at convert time and reported by
    the device's runner); ``artifacts`` is a file-name glob (``*_edgetpu.tflite``: only the compiled Edge TPU
    model, not the CPU fallbacks beside it).
    """

    format: Format
    on: str
    min_nodes_pct: float = 100.0
    artifacts: str = "*"

    def __post_init__(self) -> None:
        if self.format not in tuple(Format):
            raise UsageError(f"placement: unknown format {self.format!r}.", hint=_FORMATS_HINT)
        if self.format in _DELEGATES and self.on not in _DELEGATES[self.format][1]:
            what, places = _DELEGATES[self.format]
            raise UsageError(f"placement: {self.on!r} is not {what}.", hint=f"Use one of: {', '.join(places)}.")
        if self.format == Format.ONNX and not self.on.endswith("ExecutionProvider"):
            raise UsageError(f"placement: {self.on!r} is not an ONNX Runtime execution provider.",
                             hint="For example TensorrtExecutionProvider or CUDAExecutionProvider.")
        if not 0 < self.min_nodes_pct <= 100:
            raise UsageError(f"placement: min_nodes_pct must lie in (0, 100] (got {self.min_nodes_pct}).")

    def applies_to(self, file: str, fmt: str) -> bool:
        return fmt == self.format and fnmatch.fnmatchcase(file, self.artifacts)


def _positive(what: str) -> Rule:
    return Rule(lambda v: v > 0, lambda v: f"must be above 0 (got {v})", what)


@dataclass(frozen=True, kw_only=True)
class GateLimits(Record):
    """The limits ``edgetk check`` gates on, each declared once, here. A target profile's keys of these names are
    these fields (:class:`~toolkit.model.targets.TargetProfile` has them), the check policy frozen into the
    manifest has them (:class:`CheckPolicy`), and :func:`~toolkit.model.targets.check_policy_from_profile` copies
    every one: a new gate limit is one field here (with its rule), read, written and carried without more code.
    """

    # The slowest median an artifact may have on the device; a profile must write it (REQUIRED).
    latency_budget_ms: Annotated[float | None, REQUIRED, _positive("Use the budget in milliseconds.")] = None
    regression: RegressionPolicy = RegressionPolicy()  # when a check is a latency regression ([regression])
    placement: tuple[PlacementExpectation, ...] = ()  # where nodes must run ([[placement]])
    # The fewest inferences per second the best point of an artifact's throughput curve may reach
    # (``check --throughput``); None: no floor.
    min_throughput_ips: Annotated[float | None, _positive("Use inferences per second.")] = None

    def __post_init__(self) -> None:
        check_rules(self)


@dataclass(frozen=True, kw_only=True)
class CheckPolicy(GateLimits):
    """Everything check gates on that is not measured: written once, at convert time, from the profile."""

    target: str | None = None
    # The accuracy tolerance the artifacts were verified against on the host (``max_top1_drop``,
    # ``min_cosine``); kept for the report, the device's outputs are gated against the golden outputs.
    tolerance: Mapping[str, float] | None = None


@dataclass(frozen=True)
class GateOptions:
    """The user's overrides of the bundle's check policy (``--budget-ms``, ``--baseline``, ``--regression-pct``)."""

    budget_ms: float | None = None
    baseline: str = "last"  # "last" | "none" | CHECK_ID
    regression_pct: float | None = None  # replaces the policy's regression.min_slowdown_pct

    def __post_init__(self) -> None:
        if self.budget_ms is not None and self.budget_ms <= 0:
            raise UsageError(f"--budget-ms must be positive, got {self.budget_ms}.")
        if self.regression_pct is not None and self.regression_pct < 0:
            raise UsageError(f"--regression-pct must be 0 or more, got {self.regression_pct}.")
        if not self.baseline:
            raise UsageError("--baseline needs a value: last, none or a CHECK_ID.")


@dataclass(frozen=True)
class Budget:
    """The latency budget in force: ``ms`` with where it came from, or None with why not."""

    ms: float | None
    source: str = ""
    skip: str | None = None


def budget_for(policy: CheckPolicy | None, options: GateOptions) -> Budget:
    if options.budget_ms is not None:
        return Budget(options.budget_ms, "--budget-ms")
    if policy is None:
        return Budget(None)  # the NO_POLICY note says why
    if policy.latency_budget_ms is None:
        return Budget(None, skip=f"latency budget: the target {policy.target or '(none)'} sets none")
    return Budget(policy.latency_budget_ms, f"target {policy.target}" if policy.target else "the bundle's policy")
