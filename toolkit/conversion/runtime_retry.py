"""An INT8 artifact its runtime cannot load, run or survive (``FailureKind.INCOMPATIBLE`` / ``DOES_NOT_RUN`` /
``CRASHED``) is rebuilt with the failing op in float (findings.md 6: a TFLite INT8 DIV with a quantized divisor
fails at run time; tflite-runtime 2.14 has no int8 DIV kernel).
The op comes from the runtime's own message: TFLite's ``LOG version 2 (...)`` or ``Node number 7 (DIV) failed
to invoke`` (an op type; on the PyTorch -> TFLite route the FX nodes it came from, ``tflite_fx``), ONNX
Runtime's ``... running Div node. Name:'div_3'`` or ``Load model ... failed:Node (div_3) Op (Div)`` (a node
name, mapped back to the source's node: ``onnx_source_nodes``; an artifact the build's own check refused is
kept beside it for that, ``onnx_io.refused_copy``), or the op ``crash_guard`` found crashing the
runtime. The rebuild is verified like any other; ``selective`` continues from it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.conversion.candidate import build_and_verify, candidate_path
from toolkit.conversion.run import Candidate, ConvertRun, Failure, FailureKind
from toolkit.conversion.routes import TF, TORCH_EXPORT
from toolkit.model.vocabulary import Format, Precision
from toolkit.runtimes.inspection.share import artifact_share

if TYPE_CHECKING:  # pragma: no cover
    from onnx import NodeProto

RETRIED = (FailureKind.INCOMPATIBLE, FailureKind.DOES_NOT_RUN, FailureKind.CRASHED)
ROUNDS = 3  # each round keeps the ops the last failure named in float: a second op may fail next

_TFLITE_VERSION = re.compile(r"\b([A-Z][A-Z0-9_]+) version \d+ \(")
_TFLITE_NODE = re.compile(r"Node number (\d+) \(([A-Z][A-Z0-9_]+)\)")
_ONNX_NODE = re.compile(  # run: "... node. Name:'n'"; load: "Node (n) Op (X)", "... in node (n)", 'In Node, ("n", X'
    r"Name:\s*'([^']+)'|\bNode \(([^)]+)\) Op \(|\bin node \(([^)]+)\)|\bIn Node, \(\"([^\"]+)\",")
_ONNX_FUSED = re.compile(r"_token_\d+$")  # onnxruntime's name for a node its optimizer fused (a QLinearConv)
_QDQ = ("QuantizeLinear", "DequantizeLinear")


def failing_ops(run: ConvertRun, failure: Failure) -> tuple[str, ...]:
    """The ops ``failure``'s message names, as ``nodes_to_exclude`` entries of its route; () when none."""
    recipe, text, framework = failure.recipe, failure.reason, run.source.framework
    if recipe.format == Format.TFLITE:
        named = [(op, None) for op in _TFLITE_VERSION.findall(text)] + [
            (op, int(index)) for index, op in _TFLITE_NODE.findall(text)]
        if framework in TF:
            found = [op for op, _ in named]
        elif framework in TORCH_EXPORT and named:
            from toolkit.conversion.pt2e import quantize as pt2e
            from toolkit.conversion.pt2e import tflite_fx
            from toolkit.runtimes.inspection.tflite import main_graph_ops

            artifact = candidate_path(run, recipe)
            ops = main_graph_ops(artifact) if artifact.exists() else []
            found = list(tflite_fx.fx_nodes(ops, pt2e.graph_ops(run.request(recipe)), named))
        else:
            return ()
    elif recipe.format == Format.ONNX:
        from toolkit.conversion.onnx.graph_io import refused_copy

        built = candidate_path(run, recipe)
        found = onnx_source_nodes(next((p for p in (built, refused_copy(built)) if p.exists()), None),
                                  onnx_named_nodes(text))
    else:
        return ()  # a .pte: ExecuTorch names no op a retry could keep float (crash_guard does not cut it)
    return tuple(dict.fromkeys(op for op in found if op not in recipe.nodes_to_exclude))


def onnx_named_nodes(text: str) -> list[str]:
    """The nodes an onnxruntime error names, in its load and run messages' words."""
    return ["".join(names) for names in _ONNX_NODE.findall(text)]


def onnx_source_nodes(artifact: Path | None, names: Sequence[str]) -> list[str]:
    """The nodes of the source model behind the nodes onnxruntime names in the INT8 ``artifact``: a fused node
    (``conv_1_token_4``) is the node it was fused from, a QuantizeLinear or DequantizeLinear the ops on either
    side of its Q/DQ pair (a weight's DequantizeLinear: the op reading the weight); other nodes keep their name.
    Without the artifact file only fused names are undone."""
    names = [_ONNX_FUSED.sub("", name) for name in names]
    if artifact is None:
        return names
    from toolkit.runtimes.inspection.onnx import load_onnx

    nodes = list(load_onnx(artifact, load_external_data=False).graph.node)
    by_name = {node.name: node for node in nodes}
    producer = {output: node for node in nodes for output in node.output}
    readers: dict[str, list[NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found: list[str] = []
    for name in names:
        node = by_name.get(name)
        if node is None or node.op_type not in _QDQ:
            found.append(name)
            continue
        while node.op_type in _QDQ and node.input[0] in producer:  # up the Q/DQ chain to the op it quantizes
            node = producer[node.input[0]]
        found += [node.name] if node.op_type not in _QDQ else []
        tensors = [by_name[name].output[0]]
        while tensors:  # down the chain to the ops that read it
            for reader in readers.get(tensors.pop(), []):
                if reader.op_type in _QDQ:
                    tensors.append(reader.output[0])
                else:
                    found.append(reader.name)
    return found


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
