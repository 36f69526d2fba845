"""An ONNX model specialised on an input that has one value (``--input-value NAME=VALUE``, or an input the
calibration data gives one value): every If whose condition then is a constant is replaced by its branch.

Why: static INT8 never enters an If body (onnxruntime's quantizer quantizes main-graph nodes), so a model whose
weights sit in the branch a sample-rate input picks (Silero VAD's ``sr``) gets no quantized artifact. With the
input fixed, the branch taken is known, and inlined it is an ordinary graph the quantizer reaches.

How: the input's readers (in the main graph and in every body) read an initializer holding the value instead; an
If whose condition depends on nothing but such values and initializers is evaluated once (onnxruntime, the
condition made an output) and replaced by its branch's nodes (their Constant nodes as initializers, the branch's
outputs passed on by Identity), repeated while nested Ifs come up. The input stays in the signature, unread:
runners feed it as before (the eval set carries the value), and the specialised model is proven to compute what
the original does at that value on the calibration samples before it is quantized (``specialised_base``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.onnx.graph_io import require_onnx, save_model
from toolkit.errors import UsageError, key_line

if TYPE_CHECKING:
    import onnx

MAX_ERROR = 1e-5  # of the output's largest magnitude (at least 1): inlining a branch does not change arithmetic
ROUNDS = 8  # nested Ifs folded at most this deep


def parse_input_values(flags: Sequence[str], inputs: Sequence[str]) -> dict[str, float]:
    """``--input-value NAME=VALUE`` (repeatable) -> {NAME: VALUE}; a name the model lacks is refused."""
    values: dict[str, float] = {}
    for text in flags:
        name, sep, value = text.partition("=")
        try:
            number = float(value) if sep else None
        except ValueError:
            number = None
        if not name or number is None:
            raise UsageError(f"--input-value {text!r} is not NAME=VALUE with a number.",
                             hint="For example --input-value sr=16000")
        if name not in inputs:
            raise UsageError(f"--input-value {text!r}: the model has no input {name!r}.",
                             hint=f"Its inputs: {', '.join(inputs)}.")
        values[name] = number
    return values


def constant_inputs(calibration: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The inputs every calibration sample gives one value (a scalar or a one-element tensor), with that value."""
    if not calibration:
        return {}
    found = {}
    for name, first in calibration[0].items():
        value = np.asarray(first)
        if value.size == 1 and all(np.array_equal(np.asarray(s[name]), value) for s in calibration[1:]):
            found[name] = value
    return found


def _readers_renamed(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every read of ``old`` in ``graph`` and its bodies reads ``new`` (a body's own input ``old`` shadows it)."""
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        for attr in node.attribute:
            for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                if not any(value.name == old for value in body.input):
                    _readers_renamed(body, old, new)


def _depends_only_on(graph: onnx.GraphProto, name: str, constants: set[str]) -> bool:
    """Whether ``name`` in the main graph is computed from ``constants`` (and initializers) alone."""
    producer = {output: node for node in graph.node for output in node.output}
    pending, seen = [name], set()
    while pending:
        current = pending.pop()
        if current in seen or current in constants or not current:
            continue
        seen.add(current)
        node = producer.get(current)
        if node is None or any(attr.HasField("g") or attr.graphs for attr in node.attribute):
            return False  # a graph input that is not fixed, or a value computed by control flow
        pending += list(node.input)
    return True


def _condition(model: onnx.ModelProto, name: str, feed: Mapping[str, np.ndarray], path: Path) -> bool:
    """The value of ``name`` (an If's condition) in ``model`` on ``feed``, by onnxruntime (``path``: scratch)."""
    from onnx import TensorProto, helper

    from toolkit.conversion.onnx.graph_io import session

    probe = require_onnx().ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.BOOL, None))
    save_model(probe, path, final_name=path.name)
    runner = session(path)
    wanted = {i.name for i in runner.get_inputs()}
    value = runner.run(None, {k: v for k, v in feed.items() if k in wanted})[0]
    return bool(np.asarray(value).reshape(-1)[0])


def _inline(graph: onnx.GraphProto, index: int, branch: onnx.GraphProto) -> None:
    """The If at ``graph.node[index]`` replaced by ``branch``'s nodes (Constant nodes as initializers)."""
    from onnx import helper

    node = graph.node[index]
    nodes = []
    for inner in branch.node:
        value = next((a.t for a in inner.attribute if a.name == "value" and a.HasField("t")), None)
        if inner.op_type == "Constant" and value is not None:
            tensor = require_onnx().TensorProto()
            tensor.CopyFrom(value)
            tensor.name = inner.output[0]
            graph.initializer.append(tensor)
        else:
            nodes.append(inner)
    graph.initializer.extend(branch.initializer)
    nodes += [helper.make_node("Identity", [out.name], [name], name=f"{node.name or name}_branch_out{k}")
              for k, (out, name) in enumerate(zip(branch.output, node.output))]
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(rest[:index] + nodes + rest[index + 1:])


def specialise(model: onnx.ModelProto, values: Mapping[str, np.ndarray], feed: Mapping[str, np.ndarray],
               scratch: Path) -> list[str]:
    """``model`` (in place) specialised on ``values`` (input -> its value); the Ifs folded, as ``name: branch``.
    ``feed``: one sample, the values included (conditions are evaluated on it); ``scratch``: a file to do so."""
    from onnx import numpy_helper

    graph = model.graph
    dtypes = {value.name: value.type.tensor_type.elem_type for value in graph.input}
    fixed = set()
    for name, value in values.items():
        constant = f"{name}__specialised"
        array = np.asarray(value).astype(require_onnx().helper.tensor_dtype_to_np_dtype(dtypes[name]))
        shape = [d.dim_value for d in next(v for v in graph.input if v.name == name).type.tensor_type.shape.dim]
        graph.initializer.append(numpy_helper.from_array(array.reshape(shape) if all(shape) else array, constant))
        _readers_renamed(graph, name, constant)
        fixed.add(constant)
    folded: list[str] = []
    for _ in range(ROUNDS):
        constants = fixed | {init.name for init in graph.initializer}
        found = next(((i, node) for i, node in enumerate(graph.node)
                      if node.op_type == "If" and _depends_only_on(graph, node.input[0], constants)), None)
        if found is None:
            break
        index, node = found
        taken = "then_branch" if _condition(model, node.input[0], feed, scratch) else "else_branch"
        folded.append(f"{node.name or node.output[0]}: {taken}")
        branch = require_onnx().GraphProto()
        branch.CopyFrom(next(a.g for a in node.attribute if a.name == taken))
        _inline(graph, index, branch)
    return folded


def _max_error(ours: Path, theirs: Path, samples: Sequence[Mapping[str, np.ndarray]]) -> float:
    """The largest difference of any output on ``samples``, relative to the output's largest magnitude."""
    from toolkit.conversion.onnx.graph_io import session

    a, b = session(ours), session(theirs)
    worst = 0.0
    for feed in samples:
        for got, want in zip(a.run(None, dict(feed)), b.run(None, dict(feed))):
            want64 = np.asarray(want, np.float64)
            scale = max(1.0, float(np.max(np.abs(want64)))) if want64.size else 1.0
            gap = float(np.max(np.abs(np.asarray(got, np.float64) - want64))) if want64.size else 0.0
            worst = max(worst, gap / scale if np.isfinite(gap) else float("inf"))
    return worst


def specialised_base(request: ConversionRequest, base: BuiltArtifact) -> BuiltArtifact:
    """The base specialised on the inputs the calibration data give one value, when that folds an If and the
    result computes what the base does on the calibration samples (within ``MAX_ERROR``); else the base, with a
    note saying why where an If was folded but the check failed."""
    from toolkit.runtimes.inspection.onnx import load_onnx

    values = constant_inputs(request.calibration)
    model = load_onnx(base.path)
    if not values or not any(node.op_type == "If" for node in model.graph.node):
        return base
    target = request.workdir / f"{base.path.stem}.specialised.onnx"
    folded: list[str] = []
    used: dict[str, np.ndarray] = {}
    for name, value in values.items():  # one input at a time: only those that pick a branch are fixed
        trial = require_onnx().ModelProto()
        trial.CopyFrom(model)
        try:
            more = specialise(trial, {name: value}, request.calibration[0], request.workdir / "specialise-probe.onnx")
        except Exception as exc:  # noqa: BLE001 - an If this cannot fold: the base as it is, said so
            return dataclasses.replace(base, notes=base.notes + (
                f"specialising on {_named({name: value})} failed ({key_line(exc)}); its Ifs stay",))
        if more:
            model, folded, used[name] = trial, folded + more, value
    if not folded:
        return base
    values = used
    save_model(model, target, final_name=target.name)
    samples = request.calibration[:: max(1, len(request.calibration) // 16)]
    error = _max_error(target, base.path, samples)
    if not error <= MAX_ERROR:
        return dataclasses.replace(base, notes=base.notes + (
            f"specialising on {_named(values)} folded {', '.join(folded)}, but the result differs from the model "
            f"by {error:.3g} of the output's range on the calibration samples; its Ifs stay",))
    note = (f"specialised on {_named(values)} (the one value every calibration sample gives it, from the data or "
            f"--input-value): If "
            f"{', '.join(folded)} folded to that branch, max difference from the unspecialised model {error:.2g} of "
            f"the output's range on {len(samples)} calibration samples; the input stays in the signature but is no "
            "longer read: this artifact computes the model at that value only (feed it that value)")
    return dataclasses.replace(base, path=target, notes=base.notes + (note,))


def _named(values: Mapping[str, np.ndarray]) -> str:
    return ", ".join(f"{name}={np.asarray(v).reshape(-1)[0]:g}" for name, v in values.items())
