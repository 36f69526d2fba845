"""Recurrent models verified over a sequence, with each model's own state fed back.

A step model (a GRU/LSTM cell exported with its state as an input and an output, as streaming models are
deployed) drifts: a small per-step error in the state compounds over the steps. Comparing independent
steps hides that, so when the model has state pairs the held-out samples are run as ONE sequence, in their
order: the first sample's state input starts it, every later step gets the state the same model (float or
artifact) returned the step before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from toolkit.model.tensors import TensorSpec

STATE_WORDS = ("state", "hidden", "cell", "memory", "carry", "h0", "c0", "h_", "c_")


@dataclass(frozen=True)
class StatePair:
    """The output fed back to an input at the next step."""

    input: str  # the input's name
    output: int  # the output's index

    def label(self, output_names: Sequence[str]) -> str:
        name = output_names[self.output] if self.output < len(output_names) else f"output_{self.output}"
        return f"{name} -> {self.input}"


@dataclass(frozen=True)
class RecurrentRun:
    """The state pairs and the float model's outputs over the held-out samples run as one sequence;
    ``candidate`` the artifact's over the same sequence (each feeding back its own state)."""

    pairs: tuple[StatePair, ...]
    reference: list[list[np.ndarray]]
    candidate: list[list[np.ndarray]] | None = None

    def with_candidate(self, candidate: list[list[np.ndarray]]) -> RecurrentRun:
        return RecurrentRun(self.pairs, self.reference, candidate)


def recurrent_run(run: Callable[[Mapping[str, np.ndarray]], Sequence[np.ndarray]],
                  feeds: Sequence[Mapping[str, np.ndarray]], inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec]) -> RecurrentRun | None:
    """The float model's sequence run, or None for a model without state pairs."""
    pairs = state_pairs(inputs, outputs)
    return RecurrentRun(pairs, run_steps(run, feeds, pairs)) if pairs else None


def state_pairs(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> tuple[StatePair, ...]:
    """Inputs that take an output back: same shape (dynamic dimensions match any) and float dtype, the input
    named like a state (state, hidden, cell, h0, ...) and the output either so named or the only one of that
    shape. Empty for a model with one input."""
    if len(inputs) < 2 or len(outputs) < 2:
        return ()
    pairs: list[StatePair] = []
    used: set[int] = set()
    for spec in inputs:
        if not spec.dtype.startswith("float"):
            continue
        same = [k for k, out in enumerate(outputs) if k not in used and _same_shape(out.shape, spec.shape)
                and out.dtype.startswith("float")]
        if not same:
            continue
        named = [k for k in same if _stateful(outputs[k].name) or spec.name.lower() in outputs[k].name.lower()]
        if _stateful(spec.name) and (named or len(same) == 1):
            k = (named or same)[0]
            pairs.append(StatePair(spec.name, k))
            used.add(k)
    if len(pairs) == len(inputs):  # every input a state: nothing drives the sequence
        return ()
    return tuple(pairs)


def _same_shape(a: Sequence[int | None], b: Sequence[int | None]) -> bool:
    """Equal ranks and dimensions, a dynamic (None) one matching any."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _stateful(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in STATE_WORDS)


def run_steps(
    run: Callable[[Mapping[str, np.ndarray]], Sequence[np.ndarray]],
    feeds: Sequence[Mapping[str, np.ndarray]],
    pairs: Sequence[StatePair] = (),
) -> list[list[np.ndarray]]:
    """Outputs for every feed; with ``pairs``, one sequence in which each step's state inputs are the outputs
    ``run`` returned at the step before (the first step takes its state from its feed)."""
    import numpy as np

    results: list[list[np.ndarray]] = []
    state: dict[str, np.ndarray] = {}
    for feed in feeds:
        step = dict(feed)
        for name, value in state.items():
            step[name] = value.astype(np.asarray(feed[name]).dtype, copy=False).reshape(np.shape(feed[name]))
        outs = [np.asarray(o) for o in run(step)]
        results.append(outs)
        state = {pair.input: outs[pair.output] for pair in pairs}
    return results
