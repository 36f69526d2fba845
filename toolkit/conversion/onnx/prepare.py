"""The fp32 base of an ONNX source (``prepare``, the route's float export in ``registry``), every step checked.

The inputs are pinned (``quant_pre_process``'s symbolic shape inference fails on dynamic ones, findings.md 3)
and the opset raised to 17 for per-channel QDQ (< 13 writes a model onnxruntime refuses). One check
(``onnx.checks.model_problem``) proves the transformed model still computes what the source does; when it
fails (an LSTM inside an ``If`` can trip onnxruntime's shape checks once shapes are pinned), the transforms are
redone one at a time and the one that breaks the model is skipped and named in the notes, never "the model".
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.onnx.checks import check_runs, model_problem
from toolkit.conversion.onnx.graph_io import opset_of, require_onnx, save_model, session, staged_file
from toolkit.errors import ConversionError, UsageError, key_line

if TYPE_CHECKING:
    import onnx

QDQ_MIN_OPSET = 13  # per-axis QuantizeLinear/DequantizeLinear
TARGET_OPSET = 17  # what prepare upgrades old models to (well supported by onnxruntime >= 1.11)


@dataclass(frozen=True)
class Transform:
    """One of the base's transforms: ``apply`` changes the model in place and appends its notes."""

    name: str  # how notes and messages name it ("ONNX shape inference")
    apply: Callable[[onnx.ModelProto, list[str]], None]


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy: onnx.ModelProto = require_onnx().ModelProto()
    copy.CopyFrom(model)
    return copy


def apply_checked(model: onnx.ModelProto, transforms: Sequence[Transform], request: ConversionRequest,
                  notes: list[str]) -> onnx.ModelProto:
    """``model`` with every transform that keeps it computing what the source does (the rest skipped, in ``notes``);
    a :class:`ConversionError` naming the source when even the untransformed model fails (then the problem is the
    user's model, not a transform)."""
    together = _copy(model)
    local: list[str] = []
    for transform in transforms:
        transform.apply(together, local)
    if model_problem(together, request) is None:
        notes.extend(local)
        return together
    problem = model_problem(model, request)
    if problem is not None:
        raise ConversionError(
            f"The source model {Path(request.source.path).name} itself {problem}, before any transform of this "
            "stage.", hint="Check that the model loads and runs in onnxruntime; re-export it if it does not.")
    current = model
    for transform in transforms:
        attempt, step_notes = _copy(current), list[str]()
        try:
            transform.apply(attempt, step_notes)
        except ConversionError as exc:
            notes.append(f"{transform.name} skipped: {exc.message}")
            continue
        problem = model_problem(attempt, request)
        if problem is None:
            current = attempt
            notes.extend(step_notes)
        else:
            notes.append(f"{transform.name} skipped: this stage's transformed model {problem} "
                         "(the source model does not); the model is used without it")
    return current


def _fix_inputs(
    model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], dynamic_batch: bool, notes: list[str]
) -> None:
    initializers = {init.name for init in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in initializers or vi.name not in shapes:
            continue
        shape = tuple(int(d) for d in shapes[vi.name])
        dims = vi.type.tensor_type.shape.dim
        before = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
        if len(dims) and len(dims) != len(shape):
            raise UsageError(
                f"Input {vi.name!r} has rank {len(dims)} {before}, but the requested shape {shape} has rank "
                f"{len(shape)}.",
                hint=f"Give --input-shape {vi.name}="
                + ",".join(["D"] * len(dims))
                + " with one size per dimension.",
            )
        vi.type.tensor_type.shape.ClearField("dim")
        for axis, size in enumerate(shape):
            dim = vi.type.tensor_type.shape.dim.add()
            if axis == 0 and dynamic_batch:
                dim.dim_param = "batch"
            else:
                dim.dim_value = size
        after = tuple("batch" if axis == 0 and dynamic_batch else s for axis, s in enumerate(shape))
        if tuple(None if a == "batch" else a for a in after) != before:
            notes.append(f"input {vi.name!r} fixed to {after} (was {tuple(before)})")


def _constants_to_initializers(model: onnx.ModelProto) -> int:
    """Top-level Constant nodes holding a tensor become initializers: the quantizer and the fp16 converter
    then see them as weights (PP-OCRv4 keeps all 342 of its weights in Constant nodes)."""
    keep, moved = [], 0
    existing = {init.name for init in model.graph.initializer}
    for node in model.graph.node:
        if (
            node.op_type == "Constant"
            and len(node.attribute) == 1
            and node.attribute[0].name == "value"
            and node.output[0] not in existing
        ):
            tensor = node.attribute[0].t
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
            moved += 1
        else:
            keep.append(node)
    if moved:
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return moved


def _name_nodes(model: onnx.ModelProto) -> int:
    """Give every unnamed node a unique name, so nodes_to_exclude and per-node errors can refer to it."""
    from toolkit.runtimes.inspection.onnx import iter_graphs

    taken = {n.name for g in iter_graphs(model.graph) for n in g.node if n.name}
    named = 0
    for graph in iter_graphs(model.graph):
        for index, node in enumerate(graph.node):
            if node.name:
                continue
            base = f"{node.op_type}_{node.output[0] if node.output else index}"
            name, k = base, 1
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            node.name = name
            taken.add(name)
            named += 1
    return named


def _convert_opset(model: onnx.ModelProto, target: int, notes: list[str], why: str) -> onnx.ModelProto:
    from onnx import version_converter

    current = opset_of(model)
    try:
        converted = version_converter.convert_version(model, target)
    except Exception as exc:
        line = key_line(exc)
        raise ConversionError(
            f"Converting the model from opset {current} to {target} failed: {line}",
            hint="Re-export the model at a newer opset from its original framework.",
        ) from exc
    notes.append(f"opset {'upgraded' if target > current else 'lowered'} {current} -> {target} ({why})")
    return converted


def _optional_upgrade(
    model: onnx.ModelProto, target: int, request: ConversionRequest, notes: list[str]
) -> onnx.ModelProto:
    """The upgrade per-channel int8 wants, kept only when the upgraded model computes what the source does;
    otherwise the model keeps its opset (int8 is then per-tensor) and the note says why."""
    current = opset_of(model)
    local: list[str] = []
    why = f"per-channel quantization needs >= {QDQ_MIN_OPSET}"
    try:
        upgraded = _convert_opset(model, target, local, why)
    except ConversionError as exc:
        notes.append(f"opset upgrade {current} -> {target} skipped ({exc.message}); int8 will be per-tensor")
        return model
    problem = model_problem(upgraded, request)
    if problem is not None:
        notes.append(f"opset upgrade {current} -> {target} skipped: the upgraded model {problem}; "
                     "int8 will be per-tensor")
        return model
    notes.extend(local)
    return upgraded


def _required_conversion(
    model: onnx.ModelProto, target: int, request: ConversionRequest, notes: list[str], why: str
) -> onnx.ModelProto:
    """A conversion the recipe or the target needs: a converted model that breaks is an error, not a skip."""
    current = opset_of(model)
    converted = _convert_opset(model, target, notes, why)
    problem = model_problem(converted, request)
    if problem is not None:
        raise ConversionError(
            f"Converting the model from opset {current} to {target} ({why}) breaks it: the converted model "
            f"{problem}.",
            hint="Re-export the model at that opset from its original framework, or pick a target that loads "
            f"opset {current}.",
        )
    return converted


def _shape_inference(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    # Stale shapes (symbolic dims of the original export) would contradict the pinned inputs.
    del model.graph.value_info[:]
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    try:
        inferred: onnx.ModelProto = require_onnx().shape_inference.infer_shapes(model, strict_mode=False,
                                                                             data_prop=True)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"ONNX shape inference failed ({key_line(exc)}); shapes left to the runtime")
        return model
    return inferred


def _fill_output_shapes(model: onnx.ModelProto, notes: list[str]) -> None:
    """Graph outputs take the shapes onnxruntime infers from a saved copy (onnx's shape inference leaves
    them blank)."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "shapes.onnx"
        save_model(model, path, final_name=path.name)
        try:
            runner = session(path)
        except Exception:  # noqa: BLE001 - a model onnxruntime does not load keeps its outputs as they are
            return
    by_name = {o.name: o for o in runner.get_outputs()}
    for out in model.graph.output:
        arg = by_name.get(out.name)
        if arg is None or arg.shape is None or out.type.tensor_type.HasField("shape"):
            continue
        shape = out.type.tensor_type.shape
        for d in arg.shape:
            dim = shape.dim.add()
            if isinstance(d, int) and d > 0:
                dim.dim_value = d
            elif isinstance(d, str):
                dim.dim_param = d


def _base_transforms(request: ConversionRequest) -> list[Transform]:
    """The base's transforms in order (``onnx.prepare.apply_checked`` skips one that breaks the model)."""

    def initializers(model: onnx.ModelProto, notes: list[str]) -> None:
        if moved := _constants_to_initializers(model):
            notes.append(f"{moved} Constant nodes turned into initializers")

    def names(model: onnx.ModelProto, notes: list[str]) -> None:
        if named := _name_nodes(model):
            notes.append(f"{named} unnamed nodes named")

    def shapes(model: onnx.ModelProto, notes: list[str]) -> None:
        model.CopyFrom(_shape_inference(model, notes))

    return [
        Transform("pinning the input shapes",
                  lambda m, n: _fix_inputs(m, request.input_shapes, request.dynamic_batch, n)),
        Transform("turning Constant nodes into initializers", initializers),
        Transform("naming nodes", names),
        Transform("ONNX shape inference", shapes),
        Transform("writing the outputs' shapes", _fill_output_shapes),
    ]


def _move_opset(model: onnx.ModelProto, request: ConversionRequest, notes: list[str]) -> onnx.ModelProto:
    """The model at the opset the recipe asks for, else within the target's ceiling, else raised to what
    per-channel QDQ needs when that keeps it computing what the source does."""
    current = opset_of(model)
    ceiling = request.max_opset
    wanted = request.recipe.opset
    if ceiling is not None and wanted is not None and wanted > ceiling:
        raise UsageError(f"The recipe asks for opset {wanted}, but the target loads at most opset {ceiling}.")
    if wanted is not None and wanted != current:
        model = _required_conversion(model, wanted, request, notes, "requested by the recipe")
    elif ceiling is not None and current > ceiling:
        model = _required_conversion(model, ceiling, request, notes,
                                     f"the target's runtime loads at most opset {ceiling}")
    elif current < QDQ_MIN_OPSET:
        target = TARGET_OPSET if ceiling is None else min(TARGET_OPSET, ceiling)
        if target > current:
            model = _optional_upgrade(model, target, request, notes)
        else:
            notes.append(
                f"opset {current} kept (target allows at most {ceiling}); int8 will be per-tensor, not per-channel"
            )
    return model


def prepare(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """The fp32 base for an ONNX source: inputs pinned (batch dynamic only with ``request.dynamic_batch``), Constant
    weights as initializers, nodes named, opset raised (never above ``request.max_opset``), shapes inferred,
    external data folded in; every change listed in ``notes``."""
    from toolkit.runtimes.inspection.onnx import load_onnx

    onnx = require_onnx()
    notes: list[str] = []
    model = _move_opset(load_onnx(Path(request.source.path)), request, notes)
    model = apply_checked(model, _base_transforms(request), request, notes)
    had_external = any(
        init.data_location == onnx.TensorProto.EXTERNAL
        for init in onnx.load(str(request.source.path), load_external_data=False).graph.initializer
    )
    if had_external:
        notes.append("external weight data folded into the model file")

    with staged_file(output) as tmp:
        save_model(model, tmp, final_name=output.name)
        check_runs(tmp, request, "prepared fp32 ONNX (this stage's copy of the source)")
    return BuiltArtifact(path=output, notes=tuple(notes), exporter=f"onnx {onnx.__version__} (source model)")
