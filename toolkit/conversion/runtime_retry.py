"""An INT8 artifact its runtime cannot load, run or survive (``FailureKind.INCOMPATIBLE`` / ``DOES_NOT_RUN`` /
``CRASHED``) is rebuilt with the failing op in float (findings.md 6: a TFLite INT8 DIV with a quantized divisor
fails at run time; tflite-runtime 2.14 has no int8 DIV kernel).
The op comes from the runtime's own message, read by the route's backend (``Backend.failing_ops``): TFLite's
``LOG version 2 (...)`` or ``Node number 7 (DIV) failed to invoke`` (an op type; on the PyTorch -> TFLite route
the FX nodes it came from, ``pt2e.tflite_fx``), ONNX Runtime's ``... running Div node. Name:'div_3'`` or ``Load
model ... failed:Node (div_3) Op (Div)`` (a node name, mapped back to the source's node: ``onnx.artifact``; an
artifact the build's own check refused is kept beside it for that, ``onnx.graph_io.refused_copy``), or the op
``crash_guard`` found crashing the runtime. A ``.pte`` names none: ExecuTorch names no op a retry could keep
float. The rebuild is verified like any other; ``selective`` continues from it.
"""

from __future__ import annotations

import dataclasses

from toolkit.conversion.candidate import build_and_verify, candidate_path
from toolkit.conversion.run import Candidate, ConvertRun, Failure, FailureKind
from toolkit.model.vocabulary import Precision
from toolkit.runtimes.inspection.share import artifact_share

RETRIED = (FailureKind.INCOMPATIBLE, FailureKind.DOES_NOT_RUN, FailureKind.CRASHED)
ROUNDS = 3  # each round keeps the ops the last failure named in float: a second op may fail next


def failing_ops(run: ConvertRun, failure: Failure) -> tuple[str, ...]:
    """The ops ``failure``'s message names, as ``nodes_to_exclude`` entries of its route (its backend reads the
    message: ``Backend.failing_ops``), less the ones already kept float; () when none."""
    recipe = failure.recipe
    found = run.backend(recipe.format).failing_ops(failure.reason, run.request(recipe), candidate_path(run, recipe))
    return tuple(dict.fromkeys(op for op in found if op not in recipe.nodes_to_exclude))


def retry(run: ConvertRun, failed: Failure) -> Candidate | None:
    """``failed``'s recipe rebuilt with the ops its runtime failed on in float; None when no op is named or
    the rebuilt artifact fails too (every try is appended to ``run.attempts``)."""
    current = failed
    for _ in range(ROUNDS):
        if current.recipe.precision != Precision.INT8 or current.kind not in RETRIED:
            return None
        ops = failing_ops(run, current)
        if not ops:
            return None
        recipe = dataclasses.replace(current.recipe, nodes_to_exclude=current.recipe.nodes_to_exclude + ops)
        run.progress(f"{recipe.label}: the runtime failed on {', '.join(ops)}; retrying with it in float")
        result = build_and_verify(run, recipe, explicit=False)
        if isinstance(result, Failure):
            run.attempts.append(result.attempt())
            current = result
            continue
        added = recipe.nodes_to_exclude[len(failed.recipe.nodes_to_exclude):]
        how = "did not load" if failed.kind is FailureKind.INCOMPATIBLE else "failed"
        why = f"runtime retry: the full INT8 artifact {how} in its runtime ({failed.reason[:160]})"
        record = dataclasses.replace(
            result.record, notes=result.record.notes + (f"{', '.join(added)} kept float: {why}",),
            quantized=artifact_share(result.built.path, recipe.precision, result.built.float_nodes,
                                     failed.recipe.nodes_to_exclude, dict.fromkeys(added, why)))
        return dataclasses.replace(result, record=record)
    return None
