"""An INT8 artifact its runtime cannot load or run (``FailureKind.INCOMPATIBLE`` / ``DOES_NOT_RUN``) is rebuilt
with the failing op in float (findings.md 6: a TFLite INT8 DIV with a quantized divisor crashes at run time).
The op comes from the runtime's own message: TFLite's ``LOG version 2 (...)`` or ``Node number 7 (DIV) failed
to invoke`` (an op type; PyTorch -> TFLite names FX nodes, so it gets no retry), ONNX Runtime's ``... running
Div node. Name:'div_3'`` (a node name). The rebuild is verified like any other; ``selective`` continues from it.
"""

from __future__ import annotations

import dataclasses
import re

from toolkit.conversion.candidate import build_and_verify
from toolkit.conversion.run import Candidate, ConvertRun, Failure, FailureKind
from toolkit.conversion.routes import TF
from toolkit.model.vocabulary import Format, Precision
from toolkit.runtimes.inspection.share import artifact_share

RETRIED = (FailureKind.INCOMPATIBLE, FailureKind.DOES_NOT_RUN, FailureKind.CRASHED)
ROUNDS = 3  # each round keeps the ops the last failure named in float: a second op may fail next

_TFLITE_VERSION = re.compile(r"\b([A-Z][A-Z0-9_]+) version \d+ \(")
_TFLITE_NODE = re.compile(r"Node number \d+ \(([A-Z][A-Z0-9_]+)\)")
_ONNX_NODE = re.compile(r"Name:\s*'([^']+)'")


def failing_ops(failure: Failure, framework: str) -> tuple[str, ...]:
    """The ops ``failure``'s message names, as ``nodes_to_exclude`` entries of its route; () when none."""
    recipe, text = failure.recipe, failure.reason
    if recipe.format == Format.TFLITE:
        if framework not in TF:
            return ()
        found = _TFLITE_VERSION.findall(text) + _TFLITE_NODE.findall(text)
    else:
        found = _ONNX_NODE.findall(text)
    return tuple(dict.fromkeys(op for op in found if op not in recipe.nodes_to_exclude))


def retry(run: ConvertRun, failed: Failure) -> Candidate | None:
    """``failed``'s recipe rebuilt with the ops its runtime failed on in float; None when no op is named or
    the rebuilt artifact fails too (every try is appended to ``run.attempts``)."""
    current = failed
    for _ in range(ROUNDS):
        if current.recipe.precision != Precision.INT8 or current.kind not in RETRIED:
            return None
        ops = failing_ops(current, run.source.framework)
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
