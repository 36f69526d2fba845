"""What the stages call: compare an artifact's outputs with the float model's on held-out inputs, and time it
on this host. Non-finite outputs make every metric non-finite, so a NaN model can never pass a tolerance.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from toolkit.model.artifact import Verification
from toolkit.verification.outputs import VerificationResult, verify_outputs
from toolkit.model.records import SliceCheck
from toolkit.model.roles import OutputDeclaration, Role, check_names, parse_output_tasks
from toolkit.verification.sequence import RecurrentRun, StatePair, recurrent_run, run_steps, state_pairs
from toolkit.model.tasks import Task, TaskChoice, choose_task, parse_task
from toolkit.model.tolerance import Tolerance
from toolkit.verification.user_metric import UserMetric
from toolkit.verification.user_metric import load as load_metric

__all__ = ["Outputs", "RecurrentRun", "StatePair", "Task", "TaskChoice", "Tolerance", "UserMetric",
           "VerificationResult", "choose_task", "compare", "declared_outputs", "golden_slices",
           "load_metric", "median_latency_ms", "parse_task", "recurrent_run", "run_all", "run_steps",
           "state_pairs", "verify_outputs"]

Outputs = list[np.ndarray]


def compare(
    reference: Sequence[Outputs],
    actual: Sequence[Outputs],
    *,
    labels: np.ndarray | None = None,
    tolerance: Tolerance | None = None,
    task: Task | TaskChoice | str | None = None,
    metric: UserMetric | None = None,
    output_names: Sequence[str] = (),
) -> Verification:
    """The manifest record of ``actual`` against ``reference`` (:func:`verify_outputs` without the verdict)."""
    return verify_outputs(reference, actual, tolerance=tolerance or Tolerance(), labels=labels, task=task,
                          metric=metric, output_names=output_names).verification


def declared_outputs(flags: Sequence[str], dataset: Sequence[OutputDeclaration],
                     names: Sequence[str]) -> tuple[OutputDeclaration, ...]:
    """The roles declared per output: ``--output-task`` first, then the data's dataset.toml for the rest;
    a name the model's outputs (``names``) lack is refused with the nearest one."""
    given = parse_output_tasks(flags)
    named = {d.output for d in given}
    declared = given + tuple(d for d in dataset if d.output not in named)
    check_names(declared, names)
    return declared


def run_all(run: Callable[[Mapping[str, np.ndarray]], Outputs], feeds: Sequence[Mapping[str, np.ndarray]]) -> list[Outputs]:
    return [[np.asarray(o) for o in run(feed)] for feed in feeds]


def median_latency_ms(
    run: Callable[[Mapping[str, np.ndarray]], object],
    feed: Mapping[str, np.ndarray],
    *,
    warmup: int = 3,
    runs: int = 30,
    budget_s: float = 2.0,
) -> float:
    """Median wall time of ``run(feed)`` over up to ``runs`` runs (fewer if ``budget_s`` runs out, at least 5)."""
    for _ in range(warmup):
        run(feed)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs and (len(times) < 5 or time.perf_counter() - start < budget_s):
        begin = time.perf_counter()
        run(feed)
        times.append((time.perf_counter() - begin) * 1000.0)
    return statistics.median(times)


def golden_slices(verification: Verification | None, tolerance: Tolerance) -> tuple[SliceCheck, ...]:
    """The per-slice checks the device repeats against the float reference (``Golden.slices``): one per slice
    the host verified, with the same limit."""
    if verification is None:
        return ()
    return tuple(
        SliceCheck(output=out.index, name=s.name, axis=s.axis, runs=s.runs, float_range=s.float_range,
                   max_error=tolerance.max_slice_error)
        for out in verification.outputs if out.role != Role.DETECTION_HEAD  # judged decoded, not by slice
        for s in out.slices if s.float_range > 0
    )
