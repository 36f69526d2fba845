"""Selective quantization: when full INT8 breaks the tolerance, keep the layers that hurt most in float.

The layers come from the one layer-wise error analysis of the full INT8 quantization (``layers.table_for``:
each quantized layer's output against float on calibration samples, worst first), the table the bundle
ships: the worst layer's ``float_group`` (the layer and the layers that read its output) is tried, then the
union of the groups of the worst ``SELECTIVE_STEPS[-1]``. No candidate is converted just to rank (the
output-sensitivity ranking, each route's ``float_groups``, stays available for analysis). A result that
passes keeps the label int8 with its float layers in ``float_nodes``, and is preferred over the fp16/fp32
fallback.

Every INT8 route has its table: Keras/SavedModel -> TFLite (the quantization debugger), PyTorch -> TFLite
(``pt2e.layer_table``: PT2E's quantize/dequantize pairs, float weights re-run on the dequantized inputs;
the rebuild reuses the full calibration's ranges) and ONNX (Q/DQ activation matching).
"""

from __future__ import annotations

import dataclasses
import math

from toolkit.conversion.candidate import Candidate, ConvertRun, Failure, build_and_verify
from toolkit.errors import ToolkitError
from toolkit.quiet import native_stderr_silenced

SELECTIVE_STEPS = (1, 3)  # how many of the best float groups (a culprit layer, maybe with its consumers) to try


def worst_nodes(run: ConvertRun, failed: Candidate) -> list[tuple[tuple[str, ...], float]]:
    """Groups of layers to keep in float, worst layer first, with that layer's per-channel error (the
    layer-wise table of ``failed``'s recipe)."""
    from toolkit.conversion.layers import table_for

    limit = 2 * max(SELECTIVE_STEPS)  # groups inside a better one add nothing to the union: take a few more
    table = table_for(run, failed.recipe, failed.built)
    rows = [r for r in table.rows if not math.isnan(r.channel_error)]
    return [(r.float_group or (r.name,), r.channel_error) for r in rows[:limit]]


def selective(run: ConvertRun, failed: Candidate) -> Candidate | None:
    """The int8 recipe of ``failed`` retried with its worst layers in float; None when that does not help.

    Every try that does not pass is appended to ``run.attempts``."""
    recipe = failed.recipe
    try:
        with native_stderr_silenced():
            ranked = worst_nodes(run, failed)
    except ToolkitError as exc:
        run.attempts.append(failed.attempt("failed", f"selective quantization unavailable: {exc.message}"))
        return None
    except Exception as exc:  # noqa: BLE001 - a framework's own error in the analysis: no selective retry
        run.attempts.append(failed.attempt(
            "failed", f"selective quantization unavailable: {type(exc).__name__}: {str(exc)[:200]}"))
        return None
    if not ranked:
        return None
    tried: set[tuple[str, ...]] = set()
    for count in SELECTIVE_STEPS:
        # the union of the first ``count`` groups that each add a node (a group inside a better one adds none)
        union: list[str] = []
        added = 0
        for group, _ in ranked:
            if added < count and any(node not in union for node in group):
                union.extend(node for node in group if node not in union)
                added += 1
        nodes = tuple(union)
        if nodes in tried:
            break
        tried.add(nodes)
        mixed = dataclasses.replace(recipe, nodes_to_exclude=tuple(dict.fromkeys(recipe.nodes_to_exclude + nodes)))
        run.progress(f"retrying {recipe.label} with {len(mixed.nodes_to_exclude)} layer(s) in float")
        result = build_and_verify(run, mixed, explicit=False)
        if isinstance(result, Failure):
            run.attempts.append(result.attempt())
            continue
        if not result.failures:
            return result
        run.attempts.append(result.attempt("dropped", "; ".join(result.problems)))
    return None
