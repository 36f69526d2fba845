"""Selective quantization: when full INT8 breaks the tolerance, keep the cheapest sensitive layers in float.

The worst ``CANDIDATE_ROWS`` rows of the layer table (``layers.table_for``) are options, alone and with their
``float_group``, ordered by their share of the model's weights (``inspection.share``) per unit of error: a
weightless op or a small layer is tried before a dense layer holding most of the weights (findings.md 6: an
"int8" TFLite kept 75% of its weights float, 0.91x the fp32 file, 1.9x its latency). The float set grows along
that order (1, 2, 4, 8 options: at most ``len(SELECTIVE_STEPS)`` builds) and the first set that passes is
kept: labelled int8 with its layers in ``float_nodes`` (mixed when they hold most of the weights), preferred
over the fp16/fp32 fallback. PyTorch -> TFLite's FX node names do not name the artifact's tensors, so there
the order is by error alone. Layers inside If/Loop/Scan bodies have no row in the table (it compares the main
graph's tensors): there the options are whole op kinds (every Conv of the model), fewest weights first. No
candidate is converted just to rank.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.conversion.candidate import build_and_verify
from toolkit.conversion.onnx_fold import body_layers
from toolkit.conversion.run import Candidate, ConvertRun, Failure
from toolkit.errors import ToolkitError
from toolkit.model.vocabulary import AttemptOutcome
from toolkit.quiet import native_stderr_silenced

if TYPE_CHECKING:
    from toolkit.runtimes.inspection.share import Layer

SELECTIVE_STEPS = (1, 2, 4)  # how many of the cheapest options the float set holds at each try
LAST_RESORT = 3  # then the worst layers' groups by error alone: the worst one, then the worst three
CANDIDATE_ROWS = 4  # the worst layers of the table that are options (each alone and with its consumers)
COST_FLOOR = 1e-3  # a weightless op still costs something: among them the worse error goes first
MOST_OF_THE_MODEL = 0.5  # a passing float set above this share of the weights is reported as most of the model

Group = tuple[str, ...]


def weight_cost(path: Path) -> Callable[[Sequence[str]], float]:
    """The share of the model's weights that the layers named by a group hold (0 when unreadable)."""
    from toolkit.runtimes.inspection.share import onnx_layers, tflite_layers

    try:
        layers = tflite_layers(path) if path.suffix == ".tflite" else onnx_layers(path)
    except Exception:  # noqa: BLE001 - no weights known: every option costs the floor, order by error
        layers = []
    return _cost_of(layers)


def _cost_of(layers: Sequence[Layer]) -> Callable[[Sequence[str]], float]:
    """The share of the weights of ``layers`` that the layers named by a group hold."""
    from toolkit.model.quantized import names_layer

    total = sum(layer.params for layer in layers) or 1

    def cost(group: Sequence[str]) -> float:
        names = set(group)
        return sum(layer.params for layer in layers if names_layer(layer.name, names)) / total

    return cost


def _by_op(layers: Sequence[Layer]) -> tuple[list[tuple[Group, float, float]], list[Group]]:
    """``options`` for layers inside bodies (no per-layer error is measured there): each weighted op kind (every
    Conv, every LSTM) is one float group, the one holding the smallest share of the weights first; the largest
    kind never (all float is no quantization)."""
    total = sum(layer.params for layer in layers) or 1
    kinds = sorted({layer.op for layer in layers},
                   key=lambda op: sum(layer.params for layer in layers if layer.op == op))[:-1]  # not all float
    return [(tuple(layer.name for layer in layers if layer.op == op), math.nan,
             sum(layer.params for layer in layers if layer.op == op) / total) for op in kinds], []


def options(run: ConvertRun, failed: Candidate) -> tuple[list[tuple[Group, float, float]], list[Group]]:
    """(group to keep float, its layer's channel error, its share of the weights), cheapest per error first;
    and the float groups of the worst rows by error alone, worst first (the last resort)."""
    from toolkit.conversion.layers import table_for

    table = table_for(run, failed.recipe, failed.built)
    rows = [r for r in table.rows if not math.isnan(r.channel_error)][:CANDIDATE_ROWS]
    cost = weight_cost(failed.built.path)
    found: list[tuple[Group, float, float]] = []
    for row in rows:
        group = row.float_group or (row.name,)
        for option in (group[:1], group):
            if option not in [f[0] for f in found]:
                found.append((option, row.channel_error, cost(option)))
    found.sort(key=lambda o: max(o[2], COST_FLOOR) / max(o[1], 1e-6))  # stable: worst first among equals
    return found, [r.float_group or (r.name,) for r in rows]


def _tries(cheap: Sequence[tuple[Group, float, float]], worst: Sequence[Group]) -> list[Group]:
    """The float sets to try in order: the cheapest options growing (``SELECTIVE_STEPS``), then the worst
    layers' groups whatever their size (1, then ``LAST_RESORT``), each set once."""
    sets = [tuple(dict.fromkeys(n for group, _, _ in cheap[:count] for n in group)) for count in SELECTIVE_STEPS]
    sets += [tuple(dict.fromkeys(n for group in worst[:count] for n in group)) for count in (1, LAST_RESORT)]
    return [s for i, s in enumerate(sets) if s and s not in sets[:i]]


def selective(run: ConvertRun, failed: Candidate) -> Candidate | None:
    """The int8 recipe of ``failed`` retried with its cheapest sensitive layers in float (layers inside bodies: by
    op kind, ``_by_op``); None when that does not help. Every try that does not pass is appended to ``run.attempts``."""
    recipe = failed.recipe
    fp32 = run.fp32.get(recipe.format)
    nested = body_layers(fp32.built.path) if isinstance(fp32, Candidate) else []
    try:
        with native_stderr_silenced():
            ranked = _by_op(nested) if nested else options(run, failed)
    except ToolkitError as exc:
        run.attempts.append(failed.attempt(AttemptOutcome.FAILED, f"selective quantization unavailable: {exc.message}"))
        return None
    except Exception as exc:  # noqa: BLE001 - a framework's own error in the analysis: no selective retry
        run.attempts.append(failed.attempt(
            AttemptOutcome.FAILED, f"selective quantization unavailable: {type(exc).__name__}: {str(exc)[:200]}"))
        return None
    cost = _cost_of(nested) if nested else weight_cost(failed.built.path)
    for union in _tries(*ranked):
        mixed = dataclasses.replace(recipe, nodes_to_exclude=tuple(dict.fromkeys(recipe.nodes_to_exclude + union)))
        run.progress(f"retrying {recipe.label} with {len(mixed.nodes_to_exclude)} layer(s) in float "
                     f"({100 * cost(union):.0f}% of the weights)")
        result = build_and_verify(run, mixed, explicit=False)
        if isinstance(result, Failure):
            run.attempts.append(result.attempt())
            continue
        if not result.failures:
            return _explained(result, failed, union, cost(union))
        run.attempts.append(result.attempt(AttemptOutcome.DROPPED, "; ".join(result.problems)))
    return None


def _explained(result: Candidate, failed: Candidate, union: Group, share: float) -> Candidate:
    """``result`` with its float layers' reason and, when the float set holds most of the weights, a note saying so."""
    from toolkit.runtimes.inspection.share import artifact_share

    why = f"selective retry: full INT8 out of tolerance ({'; '.join(failed.failures)[:160]})"
    notes = result.record.notes
    if share > MOST_OF_THE_MODEL:
        notes += (f"selective quantization: the only passing float set found holds {100 * share:.0f}% of the "
                  "weights; most of the model stays float",)
    record = dataclasses.replace(result.record, notes=notes, quantized=artifact_share(
        result.built.path, result.recipe.precision, result.built.float_nodes, failed.recipe.nodes_to_exclude,
        dict.fromkeys(union, why)))
    return dataclasses.replace(result, record=record)
