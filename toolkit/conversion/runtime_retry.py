"""An INT8 artifact its runtime cannot load, run or survive (``FailureKind.INCOMPATIBLE`` / ``DOES_NOT_RUN`` /
``CRASHED``) is rebuilt with the failing op in float (findings.md 6: a TFLite INT8 DIV with a quantized divisor
fails at run time; tflite-runtime 2.14 has no int8 DIV kernel).
The op comes from the runtime's own message: TFLite's ``LOG version 2 (...)`` or ``Node number 7 (DIV) failed
to invoke`` (an op type; on the PyTorch -> TFLite route the FX nodes it came from, ``tflite_fx``), ONNX
Runtime's ``... running Div node. Name:'div_3'`` (a node name), or the op ``crash_guard`` found crashing the
runtime. The rebuild is verified like any other; ``selective`` continues from it.
"""

from __future__ import annotations

import dataclasses
import re

from toolkit.conversion.candidate import build_and_verify, candidate_path
from toolkit.conversion.run import Candidate, ConvertRun, Failure, FailureKind
from toolkit.conversion.routes import TF, TORCH_EXPORT
from toolkit.model.vocabulary import Format, Precision
from toolkit.runtimes.inspection.share import artifact_share

RETRIED = (FailureKind.INCOMPATIBLE, FailureKind.DOES_NOT_RUN, FailureKind.CRASHED)
ROUNDS = 3  # each round keeps the ops the last failure named in float: a second op may fail next

_TFLITE_VERSION = re.compile(r"\b([A-Z][A-Z0-9_]+) version \d+ \(")
_TFLITE_NODE = re.compile(r"Node number (\d+) \(([A-Z][A-Z0-9_]+)\)")
_ONNX_NODE = re.compile(r"Name:\s*'([^']+)'")


def failing_ops(run: ConvertRun, failure: Failure) -> tuple[str, ...]:
    """The ops ``failure``'s message names, as ``nodes_to_exclude`` entries of its route; () when none."""
    recipe, text, framework = failure.recipe, failure.reason, run.source.framework
    if recipe.format == Format.TFLITE:
        named = [(op, None) for op in _TFLITE_VERSION.findall(text)] + [
            (op, int(index)) for index, op in _TFLITE_NODE.findall(text)]
        if framework in TF:
            found = [op for op, _ in named]
        elif framework in TORCH_EXPORT and named:
            from toolkit.conversion import pt2e, tflite_fx
            from toolkit.runtimes.inspection.tflite import main_graph_ops

            artifact = candidate_path(run, recipe)
            ops = main_graph_ops(artifact) if artifact.exists() else []
            found = list(tflite_fx.fx_nodes(ops, pt2e.graph_ops(run.request(recipe)), named))
        else:
            return ()
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
