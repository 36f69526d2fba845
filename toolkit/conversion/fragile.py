"""Patterns static INT8 is known to break, found before quantizing and kept in float up front.

* **A Concat of quantities with different ranges feeding an output**: a detection head's final Concat puts box
  coordinates (0-320) and class scores (0-1) in one tensor, which gets ONE int8 scale, so the scores collapse
  to two or three levels (a YOLOv8-style detector lost half its detections that way while the whole-tensor
  cosine stayed at 0.998). When the float ranges of a Concat's inputs on the calibration samples differ by more
  than ``RANGE_RATIO``, the Concat (and the reshapes between it and the output) stay float; each input keeps
  the scale of its own producer.
* **The first op after an integer input** (the Gather of an embedding, the Cast/OneHot of ids): quantized, an
  embedding table's rows and a one-hot's levels are rounded; kept float they stay exact, and the layers after
  them quantize their inputs as usual.
* **Decomposed LayerNorm and GELU** (ReduceMean/Sub/Pow/Sqrt/Div chains, Erf or Tanh with Pow): quantizing their
  elementwise ops destroys models that MatMul-only quantization keeps intact (findings.md 5). The statistics
  and nonlinear nodes and the elementwise nodes next to them stay float; the MatMuls around them are quantized.

``onnx_fragile_nodes`` returns ``(node name, why)`` pairs; ``onnx_quant`` adds them to ``nodes_to_exclude``
and lists them in the artifact's ``float_nodes`` and notes. ``tflite_fragile_nodes`` applies the Concat rule, with
the detection head's Sigmoid/Softmax/DFL post-processing behind it, the integer-input rule and the
LayerNorm/GELU rule (RSQRT/SQRT/POW/SQUARED_DIFFERENCE and the elementwise ops next to them) to a calibrated
Keras/SavedModel -> TFLite graph; ``tflite`` denylists the nodes and keeps the output the Concat writes float (recorded as ``FloatIO``).
``pt2e_fragile_nodes`` applies the Concat rule and the head behind it to the float FX graph of the PyTorch -> TFLite
route (PT2E); ``pt2e`` drops the nodes' quantization annotations and ``torch_tflite`` keeps that output float.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RANGE_RATIO = 100.0  # float ranges of a Concat's inputs further apart than this get separate scales
RANGE_SAMPLES = 8  # calibration samples the ranges are measured on
PASSTHROUGH = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
STATISTICS = frozenset({"Erf", "Pow", "Sqrt", "Reciprocal"})
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Tanh", "ReduceMean"})
# ops that turn integer ids into float values: kept float where they read an integer input
INTEGER_READERS = frozenset({"Gather", "GatherElements", "GatherND", "OneHot", "Cast", "Equal"})


def _graph_maps(graph: Any) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return producers, consumers


def _output_concats(graph: Any, consumers: Mapping[str, list[Any]]) -> list[tuple[Any, list[Any]]]:
    """Concats whose output reaches a graph output through pass-through nodes only, with those nodes."""
    outputs = {o.name for o in graph.output}
    found = []
    for node in graph.node:
        if node.op_type != "Concat" or len(node.input) < 2:
            continue
        path: list[Any] = []
        current = node
        while True:
            if any(out in outputs for out in current.output):
                found.append((node, path))
                break
            readers = [r for out in current.output for r in consumers.get(out, [])]
            if len(readers) != 1 or readers[0].op_type not in PASSTHROUGH:
                break
            current = readers[0]
            path.append(current)
    return found


def _mixed_range_concats(
    model_path: Path, graph: Any, concats: Sequence[tuple[Any, list[Any]]], feeds: Sequence[Mapping[str, np.ndarray]]
) -> list[tuple[str, str]]:
    from toolkit.conversion.onnx_io import require_onnx, run_outputs

    onnx = require_onnx()
    initializers = {i.name for i in graph.initializer}
    names = sorted({name for concat, _ in concats for name in concat.input if name and name not in initializers})
    if not names or not feeds:
        return []
    model = onnx.load(str(model_path))
    with tempfile.TemporaryDirectory(prefix="edgetk-ranges-") as scratch:
        values = run_outputs(model, names, Path(scratch), feeds[:RANGE_SAMPLES])
    ranges = {n: max((float(np.max(np.abs(v))) for v in values[n] if np.size(v)), default=0.0) for n in names}
    found = []
    for concat, path in concats:
        spans = [ranges.get(name, 0.0) for name in concat.input if name in ranges]
        live = [s for s in spans if s > 0.0]
        if len(live) >= 2 and max(live) > RANGE_RATIO * min(live):
            why = _span_why(min(live), max(live))
            found.append((concat.name, f"final Concat {concat.name!r}: {why}"))
            found.extend((p.name, f"between {concat.name!r} and the output") for p in path)
    return found


def _decompositions(graph: Any, producers: Mapping[str, Any], consumers: Mapping[str, list[Any]]) -> list[tuple[str, str]]:
    """The statistics/nonlinear nodes of decomposed LayerNorm/GELU and the elementwise nodes next to them."""
    found: dict[str, str] = {}
    for node in graph.node:
        if node.op_type not in STATISTICS:
            continue
        found.setdefault(node.name, f"{node.op_type} of a decomposed LayerNorm/GELU")
        neighbours = [producers[i] for i in node.input if i in producers]
        neighbours += [c for out in node.output for c in consumers.get(out, [])]
        for other in neighbours:
            if other.op_type in ELEMENTWISE and other.name:
                found.setdefault(other.name, f"{other.op_type} next to {node.op_type} {node.name!r}")
    return list(found.items())


def _integer_input_readers(graph: Any, consumers: Mapping[str, list[Any]]) -> list[tuple[str, str]]:
    """The first float op after each integer graph input (through integer pass-through nodes): the Gather of an
    embedding, the Cast or OneHot of ids. Quantized, an embedding table's rows and a one-hot's levels are
    rounded; kept float they stay exact (the layers after them quantize their inputs as usual)."""
    from toolkit.conversion.onnx_io import require_onnx

    proto = require_onnx().TensorProto
    integer = {proto.INT64, proto.INT32, proto.INT16, proto.INT8, proto.UINT8, proto.UINT16, proto.UINT32, proto.UINT64}
    found: list[tuple[str, str]] = []
    for value in graph.input:
        if value.type.tensor_type.elem_type not in integer:
            continue
        pending, seen = [value.name], set()
        while pending:
            tensor = pending.pop()
            for node in consumers.get(tensor, []):
                if node.name in seen:
                    continue
                seen.add(node.name)
                if node.op_type in PASSTHROUGH:  # still the ids, reshaped
                    pending.extend(node.output)
                elif node.op_type in INTEGER_READERS and node.name:
                    found.append((node.name, f"{node.op_type} {node.name!r}: the first op after the integer input "
                                  f"{value.name!r} (kept exact)"))
    return found


def onnx_fragile_nodes(model_path: Path, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[tuple[str, str]]:
    """``(node, why)`` for every node of the top graph that static INT8 should leave float (module docstring)."""
    from toolkit.conversion.onnx_io import require_onnx

    graph = require_onnx().load(str(model_path), load_external_data=False).graph
    producers, consumers = _graph_maps(graph)
    found: dict[str, str] = {}
    concats = _output_concats(graph, consumers)
    if concats:
        for name, why in _mixed_range_concats(model_path, graph, concats, feeds):
            found.setdefault(name, why)
    for name, why in _decompositions(graph, producers, consumers):
        found.setdefault(name, why)
    for name, why in _integer_input_readers(graph, consumers):
        found.setdefault(name, why)
    return [(name, why) for name, why in found.items() if name]


# --------------------------------------------------------------------------------------------- TFLite
# The same rules on a Keras/SavedModel -> TFLite graph, read from the calibrated model (each tensor carries the
# min/max the calibration measured): ``tflite`` denylists the nodes (``mlir_quantize``'s denylisted nodes) and
# keeps an output such a Concat writes float even when the recipe asks for int8 I/O (``FloatIO``).

TFLITE_PASSTHROUGH = frozenset({"RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS"})
TFLITE_INTEGER_READERS = frozenset({"GATHER", "GATHER_ND", "EMBEDDING_LOOKUP", "CAST", "ONE_HOT", "EQUAL"})
# decomposed LayerNorm (MEAN, SQUARED_DIFFERENCE, RSQRT, MUL, NEG, ADD) and GELU (POW/TANH chains); a builtin GELU
# op is one quantized kernel and is left alone
TFLITE_STATISTICS = frozenset({"RSQRT", "SQRT", "POW", "SQUARED_DIFFERENCE"})
TFLITE_ELEMENTWISE = frozenset({"ADD", "SUB", "MUL", "DIV", "NEG", "MEAN", "TANH"})
# a detection head's post-processing between its last convolutions and the final Concat: Sigmoid/Softmax, the
# box decoding arithmetic, the inner Concat of centres and sizes
TFLITE_HEAD_OPS = frozenset({"LOGISTIC", "SOFTMAX", "MUL", "ADD", "SUB", "DIV", "CONCATENATION"})
HEAD_DEPTH = 8  # ops walked back from each input of the final Concat


def _tflite_graph(model: bytes) -> tuple[list[tuple[str, list[str], list[str]]], set[str], dict[str, float], set[str]]:
    """(op kind, input tensor names, output tensor names) per op of the main graph, the graph's output names,
    each tensor's calibrated magnitude (max |min|, |max|), and the constant tensors."""
    ops, outputs, magnitude, constants, _integer, _ids = _tflite_graph_inputs(model)
    return ops, outputs, magnitude, constants


def tflite_integer_inputs(model: bytes) -> set[str]:
    """The names of the main graph's integer inputs (token ids)."""
    return _tflite_graph_inputs(model)[4]


def _tflite_graph_inputs(
    model: bytes,
) -> tuple[list[tuple[str, list[str], list[str]]], set[str], dict[str, float], set[str], set[str], set[str]]:
    """``_tflite_graph`` and the integer graph inputs, and every integer or boolean tensor (what ids become
    before a lookup: Keras' Embedding wraps negative ids with LESS/ADD/SELECT first)."""
    from tensorflow.lite.python import schema_py_generated as fb
    from tensorflow.lite.python import util as tf_util

    obj = tf_util._convert_model_from_bytearray_to_object(model)
    graph = obj.subgraphs[0]
    names = {v: k for k, v in vars(fb.BuiltinOperator).items() if not k.startswith("_")}

    def text(raw: Any) -> str:
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
    return ops, outputs, magnitude, constants, integer, ids


def tflite_fragile_nodes(calibrated: bytes) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """``(node, why)`` for the ops of a calibrated TFLite model that INT8 should leave float, and the graph
    outputs that must then stay float (output tensor name -> why): a final Concat whose inputs' calibrated
    ranges are more than ``RANGE_RATIO`` apart, the pass-through ops between it and the output, and the head's
    post-processing behind it (``TFLITE_HEAD_OPS`` through pass-through ops; a convolution reading a Softmax:
    the DFL). Node names are op output tensor names, as ``tflite.resolve_nodes`` takes them."""
    ops, outputs, magnitude, constants, integer, ids = _tflite_graph_inputs(calibrated)
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
        why = _span_why(min(spans), max(spans))
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
    return any(kind in TFLITE_STATISTICS for kind, _ins, _outs in _tflite_graph(model)[0])


def _head_behind(start: str, ops: Sequence[tuple[str, list[str], list[str]]], producer: Mapping[str, int],
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


# --------------------------------------------------------------------------------------------- PT2E (PyTorch)
# The Concat rule on the PyTorch -> TFLite route, applied to the float graph ``torch.export`` gives (the graph
# ``pt2e.quantize`` annotates, so the node names are the ones its exclusion takes). The ranges cannot come from
# PT2E's observers. Where litert-torch's ``cat`` annotation applies, the cat's inputs and output share one
# observer (``SharedQuantizationSpec`` with the first input), which sees them all together; on the trained
# detector of the tests it did not match the exported cats at all, and their inputs were observed only where
# an op before them is quantized (the box sizes' ``mul``, but not the box centres' ``add`` nor the scores'
# sigmoid). The TFLite converter then gives the concatenations the scale of their one quantized input (its
# same-scale rule for CONCATENATION): the int8 output got 0.53, the scores collapsed to {0, 0.53}. So the
# ranges come from running the float graph (a ``torch.fx.Interpreter``) on up to ``RANGE_SAMPLES``
# calibration samples.
# The other two rules are not needed on this route: litert-torch's quantizer annotates no ``layer_norm``,
# ``gelu`` or ``embedding`` node (they are converted as float ops; softmax and sigmoid get fixed [0, 1]
# parameters), so a LayerNorm/GELU and the first op after an integer input already stay float.

# pass-through ops (slices and splits too: a YOLOv8 head splits its box and score channels out of one tensor)
PT2E_PASSTHROUGH = frozenset({
    "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "flatten", "squeeze", "unsqueeze", "contiguous",
    "clone", "alias", "expand", "unflatten", "slice", "select", "narrow", "split", "split_with_sizes", "getitem",
})
# a detection head's post-processing: Sigmoid/Softmax, the box decoding arithmetic, the inner cat of centres and
# sizes (as TFLITE_HEAD_OPS); a convolution or linear layer reading a Softmax is the DFL
PT2E_HEAD_OPS = frozenset({"sigmoid", "softmax", "_softmax", "mul", "add", "sub", "div", "cat"})
PT2E_WEIGHTED = frozenset({"conv1d", "conv2d", "convolution", "linear"})


@dataclass(frozen=True)
class MixedOutput:
    """A graph output written by a mixed-range final cat: it must stay float32 even with int8 I/O."""

    index: int  # position among the graph's (flattened) outputs
    writer: str  # the node that writes it: the cat, or the last pass-through op after it
    why: str


def _span_why(low: float, high: float) -> str:
    return f"its inputs span {low:.3g} to {high:.3g} (one int8 scale would flatten the small ones)"


def upfront_note(found: Sequence[tuple[str, str]]) -> str:
    """The artifact note that lists the nodes kept float up front, with why (the first six)."""
    return (f"kept in float up front ({len(found)} node(s), known to break in int8): "
            + "; ".join(why for _, why in found[:6]) + ("; ..." if len(found) > 6 else ""))


def _fx_op(node: Any) -> str:
    """The op of an FX node without its overload (``aten.flatten.using_ints`` -> ``flatten``); '' if none."""
    if getattr(node, "op", None) != "call_function":
        return ""
    target = node.target
    return str(getattr(target, "__name__", target)).split(".")[0]


def _cat_inputs(cat: Any) -> list[Any]:
    """The inputs of a ``cat`` node that are computed (not constants)."""
    tensors = cat.args[0] if cat.args else ()
    return [t for t in tensors if getattr(t, "op", None) not in (None, "get_attr")]


def pt2e_output_cats(graph: Any) -> list[tuple[Any, list[Any], int]]:
    """``cat`` nodes of an FX graph module whose output reaches a graph output through pass-through ops only,
    with those ops and the output's index: the Concat rule's candidates (the cheap structural test)."""
    nodes = list(graph.graph.nodes)
    output = next((n for n in nodes if n.op == "output"), None)
    if output is None or not output.args:
        return []
    written = output.args[0]
    flat = list(written) if isinstance(written, (tuple, list)) else [written]
    index = {node: i for i, node in enumerate(flat) if hasattr(node, "op")}
    found = []
    for node in nodes:
        if _fx_op(node) != "cat" or len(_cat_inputs(node)) < 2:
            continue
        path: list[Any] = []
        current = node
        while current not in index:
            users = list(current.users)
            if len(users) != 1 or _fx_op(users[0]) not in PT2E_PASSTHROUGH:
                break
            current = users[0]
            path.append(current)
        if current in index:
            found.append((node, path, index[current]))
    return found


def pt2e_fragile_nodes(
    torch: Any, graph: Any, samples: Sequence[Sequence[Any]]
) -> tuple[list[tuple[str, str]], list[MixedOutput]]:
    """``(node, why)`` for the nodes of a float FX graph (``torch.export(...).module()``) that PT2E INT8 should
    leave float, and the outputs that must then stay float: a final cat whose inputs' max |value| on the first
    ``RANGE_SAMPLES`` of ``samples`` (argument tuples) are more than ``RANGE_RATIO`` apart, the pass-through ops
    between it and the output, and the head's post-processing behind it (``PT2E_HEAD_OPS`` through pass-through
    ops; a convolution or linear layer reading a softmax: the DFL), up to ``HEAD_DEPTH`` ops back."""
    import torch.fx

    cats = pt2e_output_cats(graph)
    if not cats or not samples:
        return [], []
    peaks = {node: 0.0 for cat, _path, _index in cats for node in _cat_inputs(cat)}

    class Watch(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            value = super().run_node(n)
            if n in peaks and isinstance(value, torch.Tensor) and value.numel():
                peaks[n] = max(peaks[n], float(value.detach().abs().max()))
            return value

    with torch.no_grad():
        for args in list(samples)[:RANGE_SAMPLES]:
            Watch(graph).run(*args)
    found: dict[str, str] = {}
    outputs: list[MixedOutput] = []
    for cat, path, index in cats:
        live = [peaks[node] for node in _cat_inputs(cat) if peaks.get(node, 0.0) > 0.0]
        if len(live) < 2 or max(live) <= RANGE_RATIO * min(live):
            continue
        why = _span_why(min(live), max(live))
        found.setdefault(cat.name, f"final Concat {cat.name!r}: {why}")
        for node in path:
            found.setdefault(node.name, f"between {cat.name!r} and the output")
        writer = (path[-1] if path else cat).name
        outputs.append(MixedOutput(index, writer, f"it is written by the final Concat {cat.name!r}: {why}"))
        for start in _cat_inputs(cat):
            _pt2e_head_behind(start, found, cat.name)
    return list(found.items()), outputs


def _pt2e_head_behind(start: Any, found: dict[str, str], concat: str) -> None:
    """Mark the post-processing nodes behind ``start`` (an input of the final cat) float, depth-first."""
    pending = [(start, 0)]
    while pending:
        node, depth = pending.pop()
        if depth >= HEAD_DEPTH or getattr(node, "op", None) != "call_function":
            continue
        kind = _fx_op(node)
        dfl = kind in PT2E_WEIGHTED and any(_fx_op(a) in ("softmax", "_softmax") for a in node.all_input_nodes)
        if kind not in PT2E_PASSTHROUGH and kind not in PT2E_HEAD_OPS and not dfl:
            continue
        # pass-through ops too: quantized, they would carry the scores on a scale of their own between float ops
        found.setdefault(node.name, f"{kind} of the detection head's post-processing before {concat!r}")
        pending.extend((a, depth + 1) for a in node.all_input_nodes)
