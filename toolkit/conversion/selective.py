"""Selective quantization: when full INT8 breaks the tolerance, keep the layers that hurt most in float.

The ranking (``sensitivity``, and each route's ``float_groups``) orders groups of layers by what keeping them
in float does to the outputs; the best group is tried, then the union of the best ``SELECTIVE_STEPS[-1]``.
A result that passes keeps the label int8 with its float layers in ``float_nodes``, and is preferred over the
fp16/fp32 fallback.
"""

from __future__ import annotations

import dataclasses

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.candidate import Candidate, ConvertRun, Failure, build_and_verify
from toolkit.errors import ToolkitError
from toolkit.quiet import native_stderr_silenced

SELECTIVE_STEPS = (1, 3)  # how many of the best float groups (a culprit layer, maybe with its consumers) to try


def worst_nodes(request: ConversionRequest, int8: BuiltArtifact) -> list[tuple[tuple[str, ...], float]]:
    """Groups of layers to keep in float, best first, with the output error each leaves (sensitivity)."""
    limit = 2 * max(SELECTIVE_STEPS)  # groups inside a better one add nothing to the union: rank a few more
    if request.recipe.format == "tflite":
        from toolkit.conversion import tflite

        return tflite.float_groups(request, limit=limit)
    from toolkit.conversion import onnx_quant, registry

    base = registry.fp32_onnx(request)
    return onnx_quant.float_groups(request, base, int8, limit=limit)


def selective(run: ConvertRun, failed: Candidate) -> Candidate | None:
    """The int8 recipe of ``failed`` retried with its worst layers in float; None when that does not help.

    Every try that does not pass is appended to ``run.attempts``."""
    recipe = failed.recipe
    try:
        with native_stderr_silenced():
            ranked = worst_nodes(run.request(recipe), failed.built)
    except ToolkitError as exc:
        run.attempts.append(failed.attempt("failed", f"selective quantization unavailable: {exc.message}"))
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
