"""The known-fragile rules of ``fragile`` on a Keras/SavedModel -> TFLite graph, read from the calibrated model
(each tensor carries the min/max the calibration measured). ``tflite`` denylists the nodes in ``mlir_quantize``
and keeps an output such a Concat writes float even with int8 I/O (recorded as ``FloatIO``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from toolkit.conversion.fragile import HEAD_DEPTH, RANGE_RATIO, span_why

TFLITE_PASSTHROUGH = frozenset({"RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS"})
TFLITE_INTEGER_READERS = frozenset({"GATHER", "GATHER_ND", "EMBEDDING_LOOKUP", "CAST", "ONE_HOT", "EQUAL"})
# decomposed LayerNorm (MEAN, SQUARED_DIFFERENCE, RSQRT, MUL, NEG, ADD) and GELU (POW/TANH chains); a builtin GELU
# op is one quantized kernel and is left alone
TFLITE_STATISTICS = frozenset({"RSQRT", "SQRT", "POW", "SQUARED_DIFFERENCE"})
TFLITE_ELEMENTWISE = frozenset({"ADD", "SUB", "MUL", "DIV", "NEG", "MEAN", "TANH"})
# a detection head's post-processing between its last convolutions and the final Concat: Sigmoid/Softmax, the
# box decoding arithmetic, the inner Concat of centres and sizes
TFLITE_HEAD_OPS = frozenset({"LOGISTIC", "SOFTMAX", "MUL", "ADD", "SUB", "DIV", "CONCATENATION"})


Op = tuple[str, list[str], list[str]]  # (op kind, input tensor names, output tensor names)


class TFLiteGraph(NamedTuple):
    """The main graph of a (calibrated) TFLite model, as the rules read it."""

    ops: list[Op]
    outputs: set[str]  # the graph's output tensors
    magnitude: dict[str, float]  # each tensor's calibrated magnitude (max |min|, |max|)
    constants: set[str]
    integer: set[str]  # the integer graph inputs (token ids)
    ids: set[str]  # every integer or boolean tensor (what ids become before a lookup: Keras' Embedding wraps
    # negative ids with LESS/ADD/SELECT first)


def tflite_graph(model: bytes) -> TFLiteGraph:
    from tensorflow.lite.python import schema_py_generated as fb
    from toolkit.compat import tensorflow as tf_compat

    obj = tf_compat.model_object(model)
    graph = obj.subgraphs[0]
    names = {v: k for k, v in vars(fb.BuiltinOperator).items() if not k.startswith("_")}

    def text(raw: object) -> str:  # a flatbuffer name: bytes or str
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    tensors = graph.tensors or []
    tensor_names = [text(t.name) for t in tensors]
    magnitude: dict[str, float] = {}
    constants: set[str] = set()
    for tensor, name in zip(tensors, tensor_names):
        q = tensor.quantization
        if q is not None and q.min is not None and q.max is not None and len(q.min) and len(q.max):
            magnitude[name] = max(abs(float(np.min(q.min))), abs(float(np.max(q.max))))
        buffer = obj.buffers[tensor.buffer] if obj.buffers and tensor.buffer < len(obj.buffers) else None
        if buffer is not None and buffer.data is not None and len(buffer.data):
            constants.add(name)
    ops = []
    for op in graph.operators or []:
        code = obj.operatorCodes[op.opcodeIndex]
        kind = str(names.get(max(int(code.builtinCode), int(code.deprecatedBuiltinCode)), "CUSTOM"))
        ins = [tensor_names[int(i)] for i in (op.inputs if op.inputs is not None else []) if int(i) >= 0]
        outs = [tensor_names[int(i)] for i in (op.outputs if op.outputs is not None else []) if int(i) >= 0]
        ops.append((kind, ins, outs))
    outputs = {tensor_names[int(i)] for i in graph.outputs}
    integer_types = {fb.TensorType.INT64, fb.TensorType.INT32, fb.TensorType.INT16, fb.TensorType.UINT8,
                     fb.TensorType.UINT16, fb.TensorType.UINT32, fb.TensorType.UINT64}
    integer = {tensor_names[int(i)] for i in graph.inputs if tensors[int(i)].type in integer_types}
    ids = {name for tensor, name in zip(tensors, tensor_names) if tensor.type in integer_types | {fb.TensorType.BOOL}}
    return TFLiteGraph(ops, outputs, magnitude, constants, integer, ids)


def tflite_fragile_nodes(calibrated: bytes) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """``(node, why)`` for the ops of a calibrated TFLite model that INT8 should leave float, and the outputs that
    must then stay float (tensor name -> why): ``fragile``'s rules on the calibrated ranges, the head behind a
    final Concat through ``TFLITE_HEAD_OPS``. Node names are op output tensor names (``tflite.resolve_nodes``)."""
    ops, outputs, magnitude, constants, integer, ids = tflite_graph(calibrated)
    producer = {out: index for index, (_kind, _ins, outs) in enumerate(ops) for out in outs}
    readers: dict[str, list[int]] = {}
    for index, (_kind, ins, _outs) in enumerate(ops):
        for name in ins:
            readers.setdefault(name, []).append(index)
    found: dict[str, str] = {}
    keep_outputs: dict[str, str] = {}
    for start in sorted(integer):  # the first op after an integer input (the module docstring)
        pending, seen = [start], set()
        while pending:
            tensor = pending.pop()
            for index in readers.get(tensor, []):
                kind, _ins, outs = ops[index]
                if index in seen or not outs:
                    continue
                seen.add(index)
                if kind in TFLITE_PASSTHROUGH or all(out in ids for out in outs):  # still ids
                    pending.extend(outs)
                elif kind in TFLITE_INTEGER_READERS:
                    found.setdefault(outs[0], f"{kind} {outs[0]!r}: the first op after the integer input {start!r} "
                                     "(kept exact)")
    for kind, ins, outs in ops:
        live_inputs = [name for name in ins if name not in constants]
        if kind != "CONCATENATION" or len(live_inputs) < 2 or not outs:
            continue
        path: list[str] = []
        current = outs[0]
        while current not in outputs:
            nxt = readers.get(current, [])
            if len(nxt) != 1 or ops[nxt[0]][0] not in TFLITE_PASSTHROUGH:
                break
            current = ops[nxt[0]][2][0]
            path.append(current)
        if current not in outputs:
            continue
        spans = [magnitude[name] for name in live_inputs if magnitude.get(name, 0.0) > 0.0]
        if len(spans) < 2 or max(spans) <= RANGE_RATIO * min(spans):
            continue
        concat = outs[0]
        why = span_why(min(spans), max(spans))
        found.setdefault(concat, f"final Concat {concat!r}: {why}")
        for name in path:
            found.setdefault(name, f"between {concat!r} and the output")
        keep_outputs[current] = f"it is written by the final Concat {concat!r}: {why}"
        for start in live_inputs:
            _head_behind(start, ops, producer, found, concat)
    for index, (kind, ins, outs) in enumerate(ops):  # decomposed LayerNorm / GELU, as on ONNX
        if kind not in TFLITE_STATISTICS or not outs:
            continue
        found.setdefault(outs[0], f"{kind} of a decomposed LayerNorm/GELU")
        neighbours = [producer[name] for name in ins if name in producer]
        neighbours += [r for out in outs for r in readers.get(out, [])]
        for other in neighbours:
            other_kind, _other_ins, other_outs = ops[other]
            if other_kind in TFLITE_ELEMENTWISE and other_outs:
                found.setdefault(other_outs[0], f"{other_kind} next to {kind} {outs[0]!r}")
    return list(found.items()), keep_outputs


def tflite_has_decomposition(model: bytes) -> bool:
    """Whether the model has an op of a decomposed LayerNorm/GELU (``TFLITE_STATISTICS``)."""
    return any(kind in TFLITE_STATISTICS for kind, _ins, _outs in tflite_graph(model).ops)


def _head_behind(start: str, ops: Sequence[Op], producer: Mapping[str, int],
                 found: dict[str, str], concat: str) -> None:
    """Mark the post-processing ops behind ``start`` (an input of the final Concat) float, depth-first."""
    pending = [(start, 0)]
    while pending:
        tensor, depth = pending.pop()
        index = producer.get(tensor)
        if index is None or depth >= HEAD_DEPTH:
            continue
        kind, ins, outs = ops[index]
        dfl = kind in ("CONV_2D", "FULLY_CONNECTED") and any(
            ops[producer[i]][0] == "SOFTMAX" for i in ins if i in producer)
        if kind not in TFLITE_PASSTHROUGH and kind not in TFLITE_HEAD_OPS and not dfl:
            continue
        # pass-through ops too: quantized, they would carry the scores on a scale of their own between float ops
        found.setdefault(outs[0], f"{kind} of the detection head's post-processing before {concat!r}")
        pending.extend((name, depth + 1) for name in ins)
