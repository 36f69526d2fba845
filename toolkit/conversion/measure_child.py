"""``python -m toolkit.conversion.measure_child JOB RESULT``: every run of one candidate artifact in its runtime,
in a process of its own (``crash_guard.measure``): load, the held-out samples, the step model's sequence, the
latency, the paired timing with fp32 and the batch sizes.

A runtime that crashes on an artifact (a kernel's segfault or abort) ends this process, not the convert run: the
parent drops that candidate, naming the signal and the stage this process announced last on its standard output
(``stage|SAMPLE|WORDS``: the held-out sample it was running, or none). ``faulthandler`` writes the Python stack of
a crash to standard error, which the parent logs under ``--debug``. An ordinary exception is a
:class:`RunFailed` with its type, the third-party module and function that raised it (``errors.origin``) and its
traceback. The job and the result travel as pickles in the run's scratch folder (arrays in, arrays out); the
verdict on the outputs (tolerance, roles, ``--metric``) stays in the parent, which has the float reference.
"""

from __future__ import annotations

import pickle
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.model.tensors import TensorSpec

if TYPE_CHECKING:
    from toolkit.conversion.host_timing import PairedTiming
    from toolkit.model.batching import BatchVerification
    from toolkit.runtimes.execution import HostSession
    from toolkit.verification.sequence import StatePair

LOADING, FIRST = "while loading it", "at its first inference"  # the stages crash_guard.first_run names too


@dataclass(frozen=True)
class MeasureJob:
    """What the child runs: the artifact, how to open it, the source's tensors and the held-out feeds."""

    artifact: Path
    threads: int | None
    config: Mapping[str, str] | None  # onnxruntime session config entries: the target's numerics
    inputs: tuple[TensorSpec, ...]  # the source model's, in its order (the feeds are keyed by their names)
    outputs: tuple[TensorSpec, ...]
    feeds: Path  # the held-out samples: a pickled tuple of feeds, written once per run (``write_feeds``)
    pairs: tuple[StatePair, ...] | None  # a step model's state pairs: also run as one sequence; None: not one
    fp32: Path | None  # timed against this fp32 artifact in alternating rounds (the profile is this host)
    batches: bool  # also at batch 4 and 8, when the artifact's batch is dynamic (--dynamic-batch)
    artifact_inputs: tuple[str, ...] = ()  # the artifact's input name per source input, as inspected: a crash's
    # sample is fed to the graph's cuts under these names (empty: they do not align, the op is not looked for)


class RunProblem(StrEnum):
    """What an ordinary exception in the child stopped."""

    LOAD = "load"  # the runtime refuses the file
    SIGNATURE = "signature"  # its inputs or outputs are not the source's
    RUN = "run"  # loaded, but running it raised


@dataclass(frozen=True)
class RunFailed:
    """An exception in the child, with where it came from (the stage, the third party's module and function)."""

    problem: RunProblem
    stage: str  # "while verifying it on held-out sample 3"
    message: str
    hint: str | None
    error: str  # the exception's type: "InvalidArgument"
    origin: str | None  # "onnxruntime.capi.onnxruntime_inference_collection.run"; None: the toolkit's own
    traceback: str  # printed by the parent under --debug

    def reason(self) -> str:
        """``the artifact does not run in its runtime: ... (InvalidArgument raised in onnxruntime..., while ...)``."""
        if self.problem is RunProblem.LOAD:
            return f"its runtime cannot load it: {self.message}"
        if self.problem is RunProblem.SIGNATURE:
            return self.message
        raised = f"{self.error} raised in {self.origin}, " if self.origin else ""
        return f"the artifact does not run in its runtime: {self.message} ({raised}{self.stage})"


@dataclass(frozen=True)
class Measurement:
    """What running the artifact found; the parent judges the outputs."""

    in_order: list[int]  # the artifact's input for each source input
    out_order: list[int]
    outputs: list[list[np.ndarray]]  # per held-out sample, in the source's output order
    steps: list[list[np.ndarray]] | None  # the sequence run (step models)
    latency: float  # median ms
    runtime: str
    timing: PairedTiming | None
    batching: BatchVerification | None
    session_inputs: tuple[TensorSpec, ...]
    session_outputs: tuple[TensorSpec, ...]


def write_feeds(feeds: Sequence[Mapping[str, np.ndarray]], path: Path) -> Path:
    """``feeds`` pickled at ``path`` (once: every candidate of a run reads the same held-out samples)."""
    if not path.is_file():
        path.write_bytes(pickle.dumps(tuple(dict(feed) for feed in feeds), protocol=pickle.HIGHEST_PROTOCOL))
    return path


def read_feeds(path: Path) -> tuple[dict[str, np.ndarray], ...]:
    feeds: tuple[dict[str, np.ndarray], ...] = pickle.loads(path.read_bytes())
    return feeds


def _stage(sample: int | None, words: str) -> None:
    print(f"stage|{'' if sample is None else sample}|{words}", flush=True)


def measure(job: MeasureJob, stage: Callable[[int | None, str], None] = _stage) -> Measurement | RunFailed:
    """Every run of the job's artifact; ``stage`` announces each before it starts."""
    from toolkit.conversion.io_align import align
    from toolkit.errors import ConversionError, ToolkitError
    from toolkit.runtimes.execution import open_session

    stage(0, LOADING)
    try:
        session = open_session(job.artifact, threads=job.threads, config=job.config)
    except Exception as exc:  # noqa: BLE001 - the runtime refuses the file: this artifact's failure only
        message = exc.message if isinstance(exc, ToolkitError) else f"{type(exc).__name__}: {exc}"
        return _failed(RunProblem.LOAD, LOADING, exc, message, exc.hint if isinstance(exc, ToolkitError) else None)
    try:
        try:
            in_order = align(job.inputs, session.inputs, what="input")
            out_order = align(job.outputs, session.outputs, what="output")
        except ConversionError as exc:
            return _failed(RunProblem.SIGNATURE, LOADING, exc, exc.message, None)
        last = [FIRST]  # the stage announced last: an exception's stage

        def announce(sample: int | None, words: str) -> None:
            last[0] = words
            stage(sample, words)

        try:
            return _runs(job, session, in_order, out_order, announce)
        except Exception as exc:  # noqa: BLE001 - a runtime's own error, reported as the artifact's failure
            message = exc.message if isinstance(exc, ToolkitError) else str(exc)
            return _failed(RunProblem.RUN, last[0], exc, message, exc.hint if isinstance(exc, ToolkitError) else None)
    finally:
        session.close()


def _runs(job: MeasureJob, session: HostSession, in_order: list[int], out_order: list[int],
          announce: Callable[[int | None, str], None]) -> Measurement:
    from toolkit.conversion.host_timing import paired_with_fp32
    from toolkit.conversion.io_align import align
    from toolkit.model.batching import batch_is_dynamic, output_step, verify_batches
    from toolkit.verification.sequence import run_steps
    from toolkit.verification.verify import median_latency_ms

    def infer(feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        native = session.run({session.inputs[j].name: feed[spec.name] for spec, j in zip(job.inputs, in_order)})
        return [np.asarray(native[j]) for j in out_order]

    feeds = read_feeds(job.feeds)
    outputs = []
    for index, feed in enumerate(feeds):
        announce(index, FIRST if index == 0 else f"while verifying it on held-out sample {index}")
        outputs.append(infer(feed))
    steps = None
    if job.pairs is not None:
        announce(None, "while running the held-out samples as one sequence (its state fed back)")
        steps = run_steps(infer, feeds, job.pairs)
    announce(0, "while timing it")
    latency = median_latency_ms(infer, feeds[0])
    timing = None
    if job.fp32 is not None:
        announce(0, "while timing it against fp32")
        timing = paired_with_fp32(job.fp32, threads=job.threads or 1, source_inputs=job.inputs, candidate=infer,
                                  feed=feeds[0], align=align)
    batching = None
    if job.batches and batch_is_dynamic(session.inputs):
        announce(None, "while verifying it at batch 4 and 8")
        batching = verify_batches(infer, feeds, outputs, output_names=[s.name for s in job.outputs],
                                  steps=[output_step(session.outputs[j]) for j in out_order])
    return Measurement(in_order, out_order, outputs, steps, latency, str(session.runtime), timing, batching,
                       tuple(session.inputs), tuple(session.outputs))


def _failed(problem: RunProblem, stage: str, exc: BaseException, message: str, hint: str | None) -> RunFailed:
    from toolkit.errors import origin

    return RunFailed(problem, stage, message, hint, type(exc).__name__, origin(exc),
                     "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def main(argv: list[str]) -> int:
    import faulthandler

    faulthandler.enable()  # a crash's Python stack on stderr: the parent logs it under --debug
    job = pickle.loads(Path(argv[0]).read_bytes())
    result = measure(job)
    Path(argv[1]).write_bytes(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    return 0


if __name__ == "__main__":  # the module under its own name, so that the result pickles with its records' names
    from toolkit.conversion import measure_child

    sys.exit(measure_child.main(sys.argv[1:]))
