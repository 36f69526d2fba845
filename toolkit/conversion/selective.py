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

ONNX routes also rank every node, activation-only ones included (``node_locator``): when the node adding the
most error is one the table has no row for (a ``Log`` of an 8-bit power spectrum, a Softmax, a Div), the
first float set is its **front end**, everything from the inputs up to and including it. Every float set is
weighed first (``retry_worth``, on the locator's added errors for ONNX, the table's channel errors elsewhere):
only sets that can remove the error are rebuilt, and when none can the retry stops at once, saying why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from toolkit.conversion import retry_worth
from toolkit.conversion.candidate import build_and_verify
from toolkit.conversion.run import OUT_OF_TOLERANCE_WORKAROUND, Candidate, ConvertRun, Failure
from toolkit.errors import ToolkitError
from toolkit.model.vocabulary import AttemptOutcome
from toolkit.quiet import native_stderr_silenced

if TYPE_CHECKING:
    from toolkit.conversion.layers import LayerTable
    from toolkit.model.recipe import Recipe
    from toolkit.conversion.node_ranking import NodeLocation
    from toolkit.runtimes.inspection.share import Layer

SELECTIVE_STEPS = (1, 2, 4)  # how many of the cheapest options the float set holds at each try
LAST_RESORT = 3  # then the worst layers' groups by error alone: the worst one, then the worst three
CANDIDATE_ROWS = 4  # the worst layers of the table that are options (each alone and with its consumers)
COST_FLOOR = 1e-3  # a weightless op still costs something: among them the worse error goes first
MOST_OF_THE_MODEL = 0.5  # a passing float set above this share of the weights is reported as most of the model

Group = tuple[str, ...]


def weight_cost(run: ConvertRun, built: Candidate) -> Callable[[Sequence[str]], float]:
    """The share of the model's weights that the layers named by a group hold (0 when unreadable), read from the
    artifact by its backend (``Backend.weight_layers``)."""
    try:
        layers = run.backend(built.recipe.format).weight_layers(built.built.path)
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


def options(table: LayerTable, cost: Callable[[Sequence[str]], float]
            ) -> tuple[list[tuple[Group, float, float]], list[Group]]:
    """(group to keep float, its layer's channel error, its share of the weights: ``cost``), cheapest per error
    first; and the float groups of the worst rows by error alone, worst first (the last resort)."""
    rows = [r for r in table.rows if not math.isnan(r.channel_error)][:CANDIDATE_ROWS]
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


@dataclasses.dataclass(frozen=True)
class _Ranked:
    """What the analysis of a failed INT8 recipe offers: the float sets in the order to try them, the measured
    error per node they are weighed against, and the weight share of a set."""

    sets: tuple[Group, ...]
    errors: Mapping[str, float]
    cost: Callable[[Sequence[str]], float]
    front_end: Group = ()  # the contiguous front end up to the locator's worst activation-only node, if any


def _ranked(run: ConvertRun, failed: Candidate) -> _Ranked:
    """The float sets of ``failed``: layers inside bodies by op kind (``_by_op``, unweighed); else the layer
    table's options, after the front end of the worst activation-only node (ONNX, ``node_locator``)."""
    from toolkit.conversion.tables import table_for

    recipe = failed.recipe
    fp32 = run.caches.fp32.get(recipe.format)
    nested = run.backend(recipe.format).nested_layers(fp32.built.path) if isinstance(fp32, Candidate) else []
    if nested:
        return _Ranked(tuple(_tries(*_by_op(nested))), {}, _cost_of(nested))
    table = table_for(run, recipe, failed.built)
    cost = weight_cost(run, failed)
    sets = _tries(*options(table, cost))
    errors: Mapping[str, float] = {r.name: r.channel_error for r in table.rows}
    front: Group = ()
    located = _located(run, failed)
    if located is not None:
        errors = located.added_errors()
        front = _front_end(located, {r.name for r in table.rows})
        sets = [front, *(s for s in sets if s != front)] if front else sets
    return _Ranked(tuple(sets), errors, cost, front)


def _located(run: ConvertRun, failed: Candidate) -> NodeLocation | None:
    """The node ranking of the recipe's full quantization by its backend (ONNX; None where the backend has none or
    it cannot be measured: the table's errors decide then)."""
    plain = dataclasses.replace(failed.recipe, nodes_to_exclude=())
    try:
        return run.backend(plain.format).locate(run.request(plain),
                                                None if failed.recipe.nodes_to_exclude else failed.built)
    except Exception as exc:  # noqa: BLE001 - a runtime's own error in the analysis: the table alone decides
        run.progress(f"node-level error locator unavailable ({type(exc).__name__}: {str(exc)[:120]})")
        return None


def _front_end(located: NodeLocation, rows: set[str]) -> Group:
    """The front end of the worst node among the top ``CANDIDATE_ROWS`` that the layer table cannot keep float
    on its own (an activation-only op, or a node with no row); () when the worst nodes are all table layers."""
    from toolkit.conversion.node_ranking import ACTIVATION_ONLY

    for node in located.nodes[:CANDIDATE_ROWS]:
        if node.added <= 0:
            break
        if node.op_type in ACTIVATION_ONLY or node.name not in rows:
            return located.front_end(node.name)
    return ()


def selective(run: ConvertRun, failed: Candidate) -> Candidate | None:
    """The int8 recipe of ``failed`` retried with its cheapest sensitive layers in float (layers inside bodies: by
    op kind, ``_by_op``; ONNX: first the front end of the worst activation-only node); only the float sets that
    the measured errors say can pass are rebuilt (``retry_worth``). None when that does not help. Every try that
    does not pass, and why the retry stopped, is appended to ``run.attempts``."""
    recipe = failed.recipe
    try:
        with native_stderr_silenced():
            ranked = _ranked(run, failed)
    except ToolkitError as exc:
        run.attempts.append(failed.attempt(AttemptOutcome.FAILED, f"selective quantization unavailable: {exc.message}"))
        return None
    except Exception as exc:  # noqa: BLE001 - a framework's own error in the analysis: no selective retry
        run.attempts.append(failed.attempt(
            AttemptOutcome.FAILED, f"selective quantization unavailable: {type(exc).__name__}: {str(exc)[:200]}"))
        return None
    weighed = [(union, retry_worth.weigh(ranked.errors, union)) for union in ranked.sets]
    worth = [union for union, w in weighed if w.worth]
    for union in worth:
        mixed = dataclasses.replace(recipe, nodes_to_exclude=tuple(dict.fromkeys(recipe.nodes_to_exclude + union)))
        what = (f"its front end up to {union[-1]} ({len(union)} nodes)" if union == ranked.front_end
                else f"{len(mixed.nodes_to_exclude)} layer(s)")
        run.progress(f"retrying {recipe.label} with {what} in float ({100 * ranked.cost(union):.0f}% of the weights)")
        result = build_and_verify(run, mixed, explicit=False)
        if isinstance(result, Failure):
            run.attempts.append(result.attempt())
            continue
        if not result.failures:
            return _explained(result, failed, union, ranked.cost(union), front_end=union == ranked.front_end)
        run.attempts.append(result.attempt(AttemptOutcome.DROPPED, "; ".join(result.problems)))
    skipped = [w for _, w in weighed if not w.worth]
    if skipped:
        why = min(skipped, key=lambda w: w.remaining).why_not()
        stop = (f"selective quantization stopped after {len(worth)} rebuild(s), {len(skipped)} float set(s) "
                f"not tried: {retry_worth.spread_summary(ranked.errors)}; the best of them: {why}")
        _say_stopped(run, recipe, stop)
    return None


def _say_stopped(run: ConvertRun, recipe: Recipe, stop: str) -> None:
    """Add why the retry stopped to the last attempt of ``recipe`` (the full INT8's, or its last rebuild's), so
    each artifact keeps one line in the attempts."""
    for index in range(len(run.attempts) - 1, -1, -1):
        attempt = run.attempts[index]
        if (attempt.recipe.format, attempt.recipe.precision) == (recipe.format, recipe.precision):
            # no retry comes after this one: the workaround is the next recipe's, not "selective is tried next"
            run.attempts[index] = dataclasses.replace(attempt, reason=f"{attempt.reason}; {stop}",
                                                      workaround=OUT_OF_TOLERANCE_WORKAROUND)
            break
    run.progress(stop)


def _explained(result: Candidate, failed: Candidate, union: Group, share: float, *, front_end: bool) -> Candidate:
    """``result`` with its float layers' reason and, when the float set holds most of the weights, a note saying so."""
    from toolkit.runtimes.inspection.share import artifact_share

    where = f"front end kept float up to {union[-1]}, the node adding the most error; " if front_end else ""
    why = f"selective retry: {where}full INT8 out of tolerance ({'; '.join(failed.failures)[:160]})"
    notes = result.record.notes
    if share > MOST_OF_THE_MODEL:
        notes += (f"selective quantization: the only passing float set found holds {100 * share:.0f}% of the "
                  "weights; most of the model stays float",)
    record = dataclasses.replace(result.record, notes=notes, quantized=artifact_share(
        result.built.path, result.recipe.precision, result.built.float_nodes, failed.recipe.nodes_to_exclude,
        dict.fromkeys(union, why)))
    return dataclasses.replace(result, record=record)
