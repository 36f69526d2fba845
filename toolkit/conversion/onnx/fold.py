"""Weights inside If/Loop/Scan bodies made visible to onnxruntime's quantizer (``folded_base``).

``quantize_dynamic`` with ``EnableSubgraph`` quantizes a body's Conv/MatMul/LSTM only when its weight is an
initializer of that body's own graph (its LSTM quantizer looks the weight up there, nowhere else). Exports with
control flow rarely have that: Silero VAD 6.2.3 keeps every weight in a Constant node of its ``If`` branch and
builds each LSTM's W and R inside a nested body from those constants (Slice, Concat, Unsqueeze). Here, inside
every body, Constant nodes become initializers of that body, and the constant subexpressions that feed a weight
operand are computed once (onnx's reference evaluator, node by node) and stored as initializers of the graph that
computed them. The main graph is left to the base's own transforms. The folded model must compute exactly what
the base does on the calibration samples (``_difference``: moving constants never rounds); otherwise it is not
used and the notes say why, as the base's own transforms are skipped (``onnx.prepare.apply_checked``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.onnx.graph_io import require_onnx, save_model
from toolkit.errors import key_line
from toolkit.runtimes.inspection.share import ONNX_WEIGHTED

if TYPE_CHECKING:
    import onnx

    from toolkit.runtimes.inspection.share import Layer

# ops whose value is not a function of their inputs, and the ones whose input is not data
_NOT_FOLDABLE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                           "Bernoulli", "Dropout"})
FOLD_STEP = "folding the weights inside If/Loop/Scan bodies"  # how notes name the step


def _bodies(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _weight_operands(graph: onnx.GraphProto) -> set[str]:
    """The names a weighted op reads, in ``graph`` and below it (every operand: a Gather's table is its first, a
    MatMul may take its constant first; only constant ones are ever folded)."""
    from toolkit.runtimes.inspection.onnx import iter_nodes

    return {name for node in iter_nodes(graph) if node.op_type in ONNX_WEIGHTED for name in node.input if name}


def _foldable(node: onnx.NodeProto, known: Container[str]) -> bool:
    """A node of the default domain, without a body, whose every input is a known constant."""
    return (node.domain in ("", "ai.onnx") and node.op_type not in _NOT_FOLDABLE
            and not any(True for _ in _bodies(node)) and all(not name or name in known for name in node.input))


def _needed(graph: onnx.GraphProto, known: Mapping[str, onnx.TensorProto]) -> set[int]:
    """Indexes of the nodes of ``graph`` to fold: Constant nodes, and the constant nodes a weight operand (here or
    in a body below) is computed from."""
    constant: dict[str, int] = {}
    names = set(known)
    for index, node in enumerate(graph.node):
        if _foldable(node, names):
            constant.update(dict.fromkeys(node.output, index))
            names.update(node.output)
    chosen = {index for index, node in enumerate(graph.node) if node.op_type == "Constant" and index in
              constant.values()}
    pending = [name for name in _weight_operands(graph) if name in constant]
    while pending:
        index = constant[pending.pop()]
        if index not in chosen:
            chosen.add(index)
            pending += [name for name in graph.node[index].input if name in constant]
    return chosen


def _evaluate(node: onnx.NodeProto, known: Mapping[str, onnx.TensorProto],
              opsets: Sequence[onnx.OperatorSetIdProto]) -> list[onnx.TensorProto]:
    """The node's outputs as tensors named like them."""
    import numpy as np

    onnx = require_onnx()
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Constant" and node.attribute[0].name == "value":
        tensor = onnx.TensorProto()
        tensor.CopyFrom(node.attribute[0].t)
        tensor.name = node.output[0]
        return [tensor]
    inputs = [name for name in node.input if name]
    graph = helper.make_graph(
        [node], "fold", [helper.make_tensor_value_info(n, known[n].data_type, None) for n in inputs],
        [helper.make_value_info(n, onnx.TypeProto()) for n in node.output])
    feeds = {name: numpy_helper.to_array(known[name]) for name in inputs}
    values = ReferenceEvaluator(helper.make_model(graph, opset_imports=list(opsets))).run(None, feeds)
    return [numpy_helper.from_array(np.asarray(value), name) for name, value in zip(node.output, values)]


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Initializers of ``graph`` that no node of it or of its bodies reads (the folded chain's sources)."""
    from toolkit.runtimes.inspection.onnx import iter_nodes

    read = {name for node in iter_nodes(graph) for name in node.input}
    read |= {value.name for value in [*graph.input, *graph.output]}
    kept = [init for init in graph.initializer if init.name in read]
    if len(kept) < len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


def fold_body_weights(model: onnx.ModelProto) -> tuple[int, int]:
    """In every If/Loop/Scan body of ``model`` (in place): Constant nodes turned into initializers, and the constant
    nodes that compute a weight folded into initializers; (Constant nodes moved, other nodes folded)."""
    counts = [0, 0]

    def visit(graph: onnx.GraphProto, outer: Mapping[str, onnx.TensorProto], body: bool) -> None:
        known = {**outer, **{init.name: init for init in graph.initializer}}
        chosen = _needed(graph, known) if body else set()
        kept = []
        for index, node in enumerate(graph.node):
            for sub in _bodies(node):
                visit(sub, known, True)
            if index not in chosen:
                kept.append(node)
                continue
            for tensor in _evaluate(node, known, model.opset_import):
                graph.initializer.append(tensor)
                known[tensor.name] = tensor
            counts[node.op_type != "Constant"] += 1
        if chosen:
            del graph.node[:]
            graph.node.extend(kept)
        _drop_unread(graph)

    visit(model.graph, {init.name: init for init in model.graph.initializer}, False)
    return counts[0], counts[1]


CHECK_SAMPLES = 16  # calibration samples, spread over the set, on which the folded model must equal the base


def _difference(folded: Path, base: Path, request: ConversionRequest) -> str | None:
    """Where the folded model's outputs differ from the base's by a single bit on the calibration samples (folding
    constants moves values, it never rounds them), or why it does not run; None when they are identical."""
    import numpy as np

    from toolkit.conversion.onnx.checks import sample_feed
    from toolkit.conversion.onnx.graph_io import session

    try:
        ours, theirs = session(folded), session(base)
    except Exception as exc:  # noqa: BLE001
        return f"does not load in onnxruntime ({key_line(exc)})"
    samples = request.calibration or ({},)
    step = max(1, len(samples) // CHECK_SAMPLES)
    for index in range(0, len(samples), step):
        feed = sample_feed(dataclasses.replace(request, calibration=(samples[index],)), ours)
        try:
            got, want = ours.run(None, feed), theirs.run(None, feed)
        except Exception as exc:  # noqa: BLE001
            return f"does not run in onnxruntime ({key_line(exc)})"
        for name, g, w in zip([o.name for o in ours.get_outputs()], got, want):
            if not np.array_equal(np.asarray(g), np.asarray(w)):
                gap = float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
                return (f"computes other values than the base (output {name!r}, calibration sample {index}: "
                        f"max {gap:.3g})")
    return None


def folded_base(request: ConversionRequest, base: BuiltArtifact, notes: list[str]) -> Path:
    """The base with its bodies' weights as initializers (``fold_body_weights``), written beside the request's
    other files when that changed anything and the folded model computes exactly what the base does on the
    calibration samples; else the note says why and the base is used as it is."""
    from toolkit.runtimes.inspection.onnx import load_onnx

    model = load_onnx(base.path)
    if not any(True for node in model.graph.node for _ in _bodies(node)):
        return base.path
    try:
        moved, folded = fold_body_weights(model)
    except Exception as exc:  # noqa: BLE001 - an op the reference evaluator cannot compute: the bodies stay
        notes.append(f"{FOLD_STEP} skipped: {key_line(exc)}; weights inside them stay float")
        return base.path
    if not moved and not folded:
        return base.path
    target = request.workdir / f"{base.path.stem}.folded.onnx"
    save_model(model, target, final_name=target.name)
    problem = _difference(target, base.path, request)
    if problem is not None:
        notes.append(f"{FOLD_STEP} skipped: the folded model {problem}; weights inside them stay float")
        target.unlink(missing_ok=True)
        return base.path
    notes.append(f"inside If/Loop/Scan bodies: {moved} Constant nodes turned into initializers, {folded} constant "
                 "nodes computing weights folded (outputs identical on the calibration samples)")
    return target


def body_layers(path: Path) -> list[Layer]:
    """The weighted layers of the ONNX model at ``path`` (its bodies' weights folded first, as the dynamic build
    folds them) when every one sits inside an If/Loop/Scan body, else none: there the layer table (main-graph
    tensors) has no row for them and static quantization never reaches them."""
    from toolkit.runtimes.inspection.onnx import load_onnx
    from toolkit.runtimes.inspection.share import onnx_model_layers

    if path.suffix.lower() != ".onnx":
        return []
    try:
        model = load_onnx(path)
        fold_body_weights(model)
        layers = onnx_model_layers(model)
    except Exception:  # noqa: BLE001 - unreadable or unfoldable: treated as a model without bodies
        return []
    return layers if layers and all(layer.nested for layer in layers) else []
