"""ONNX float base -> fp32 / fp16 / dynamic / int8 artifacts, with onnxruntime's own tools.

Two steps (see ``registry``): ``prepare`` turns an ONNX *source* into the fp32 base every precision derives
from; ``derive`` builds one recipe's artifact from that base, whatever exported it.

Real models break the plain onnxruntime.quantization path (findings.md 3, PP-OCRv4 det, opset 12):

* ``quant_pre_process`` fails with "Incomplete symbolic shape inference" on dynamic inputs: ``prepare`` pins
  the input shapes first, and ``derive`` retries with ``skip_symbolic_shape=True`` (then with no
  pre-processing at all) when it still fails;
* per-channel QDQ on opset < 13 writes a model onnxruntime refuses ("Unrecognized attribute: axis for operator
  DequantizeLinear"): ``prepare`` upgrades the opset (to 17, never above ``request.max_opset``), and
  ``derive`` falls back to per-tensor when the opset must stay old;
* fp16 conversion clips a BatchNormalization variance of 9.8e7 to 1e4 ("will be truncated") and the model's
  output collapses: ``derive`` finds every constant fp16 cannot hold and keeps the nodes that read it in
  float32 (listed in ``float_nodes`` and the notes). onnxconverter-common only honours its node block list
  when the blocked node's initializers carry no value_info, so those entries are dropped first.

Every artifact is written to a temporary file beside ``output``, loaded in onnxruntime and run once on a
calibration sample, and only then renamed into place: a failure never leaves a file at ``output``.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.conversion.base import BuiltArtifact, ConversionRequest, as_input_dtype
from toolkit.conversion.onnx_io import require_onnx as _onnx
from toolkit.conversion.onnx_io import run_outputs as _run_outputs
from toolkit.conversion.onnx_io import save_model
from toolkit.conversion.onnx_prepare import Transform, apply_checked, fill_output_shapes
from toolkit.errors import ConversionError, MissingDependency, UsageError
from toolkit.model.vocabulary import A16W8_MIN_ONNXRUNTIME

if TYPE_CHECKING:
    import onnx

QDQ_MIN_OPSET = 13  # per-axis QuantizeLinear/DequantizeLinear
TARGET_OPSET = 17  # what prepare upgrades old models to (well supported by onnxruntime >= 1.11)
FP16_MAX = 65504.0
INT16_QDQ_OPSET = 21  # ai.onnx QuantizeLinear/DequantizeLinear take int16 from opset 21 (onnx/onnx#5737)
_MAX_DEBUG_SAMPLES = 4


# --------------------------------------------------------------------------------------------- helpers


def key_line(exc: BaseException) -> str:
    """The line of a converter/runtime exception that says what went wrong (onnxruntime puts it last)."""
    text = str(exc).strip() or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[-1] if lines else text
    if len(lines) > 1 and len(line) < 20:
        line = " ".join(lines[-2:])
    return line[:400]


def _hint_for(message: str) -> str:
    if "Unrecognized attribute: axis" in message:
        return (
            "The model's opset is too old for per-channel quantization (needs >= 13): allow a newer opset for the "
            "target, or use a recipe with per_channel = false."
        )
    if "symbolic shape" in message.lower() or "shape inference" in message.lower():
        return "Pin every dynamic input dimension with --input-shape NAME=D0,D1,..."
    if "opset" in message.lower() or "version" in message.lower():
        return "Allow a newer ONNX opset for the target (max_opset), or convert from the original framework."
    return "Try another precision (fp32 always works), exclude the failing node with nodes_to_exclude, or run with --debug."


def opset_of(model: onnx.ModelProto) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


@contextlib.contextmanager
def staged_file(output: Path) -> Iterator[Path]:
    """A temporary path beside ``output``; renamed onto ``output`` only if the block finishes."""
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{output.stem}.", suffix=".partial.onnx", dir=output.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)


def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def sample_feed(request: ConversionRequest, session: Any) -> dict[str, np.ndarray]:
    """One calibration sample, or (without calibration data) a deterministic random one of the right shape."""
    sample = request.calibration[0] if request.calibration else {}
    feed: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        if arg.name in sample:
            feed[arg.name] = np.asarray(sample[arg.name]).astype(_NP.get(arg.type, np.float32))
        else:
            feed[arg.name] = _synthetic(arg, request)
    return feed


_NP = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(bool)": np.bool_,
    "tensor(double)": np.float64,
}


def _synthetic(arg: Any, request: ConversionRequest) -> np.ndarray:
    shape = request.input_shapes.get(arg.name) or tuple(
        d if isinstance(d, int) and d > 0 else 1 for d in arg.shape
    )
    dtype = _NP.get(arg.type, np.float32)
    rng = np.random.default_rng(0)
    if np.issubdtype(dtype, np.floating):
        return rng.random(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def check_runs(path: Path, request: ConversionRequest, what: str) -> list[np.ndarray]:
    """Load ``path`` in onnxruntime and run it once; a model the runtime rejects is a ConversionError."""
    try:
        session = _session(path)
    except Exception as exc:
        line = key_line(exc)
        raise ConversionError(
            f"onnxruntime cannot load the {what} model: {line}", hint=_hint_for(line)
        ) from exc
    feed = sample_feed(request, session)
    try:
        outputs = [np.asarray(o) for o in session.run(None, feed)]
    except Exception as exc:
        line = key_line(exc)
        raise ConversionError(
            f"The {what} model fails to run in onnxruntime: {line}", hint=_hint_for(line)
        ) from exc
    for arg, out in zip(session.get_outputs(), outputs):
        if np.issubdtype(out.dtype, np.floating) and not np.all(np.isfinite(out)):
            raise ConversionError(
                f"The {what} model gives NaN/Inf in output {arg.name!r} on a calibration sample.",
                hint="This precision cannot represent the model's values; use fp32 or int8 for it.",
            )
    return outputs


def transform_problem(path: Path, request: ConversionRequest) -> str | None:
    """Why the float model at ``path`` no longer is the source model: it does not load in onnxruntime, does
    not run, or computes other outputs than the source on a calibration sample. None when it is the same.

    Every graph transform of this module (opset conversion, shape inference, ``quant_pre_process``) is checked
    with it: transforms can break models with control flow (an LSTM inside an ``If``) that load fine before."""
    try:
        session = _session(path)
    except Exception as exc:  # noqa: BLE001
        return f"does not load in onnxruntime ({key_line(exc)})"
    feed = sample_feed(request, session)
    try:
        got = [np.asarray(o) for o in session.run(None, feed)]
    except Exception as exc:  # noqa: BLE001
        return f"does not run in onnxruntime ({key_line(exc)})"
    try:
        want = [np.asarray(o) for o in request.source.predict(feed)]
    except Exception:  # noqa: BLE001 - the feed is the model's; a source that names inputs otherwise is not judged
        return None
    if len(want) != len(got):
        return f"has {len(got)} outputs instead of {len(want)}"
    for index, (w, g) in enumerate(zip(want, got)):
        if w.shape != g.shape:
            return f"gives output {index} the shape {g.shape} instead of {w.shape}"
        if not np.issubdtype(w.dtype, np.number):
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        error = float(np.max(np.abs(w64 - g64))) if w.size else 0.0
        scale = max(1.0, float(np.max(np.abs(w64))) if w.size else 1.0)
        if not np.all(np.isfinite(g64)) or error > 1e-3 * scale:
            return f"computes other values in output {index} (max error {error:.3g})"
    return None


def _model_problem(model: onnx.ModelProto, request: ConversionRequest) -> str | None:
    path = request.workdir / "transform-check.onnx"
    request.workdir.mkdir(parents=True, exist_ok=True)
    try:
        save_model(model, path, final_name=path.name)
        return transform_problem(path, request)
    finally:
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------- prepare


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
    problem = _model_problem(upgraded, request)
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
    problem = _model_problem(converted, request)
    if problem is not None:
        raise ConversionError(
            f"Converting the model from opset {current} to {target} ({why}) breaks it: the converted model "
            f"{problem}.",
            hint="Re-export the model at that opset from its original framework, or pick a target that loads "
            f"opset {current}.",
        )
    return converted


def _shape_inference(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    onnx = _onnx()
    # Stale shapes (symbolic dims of the original export) would contradict the pinned inputs.
    del model.graph.value_info[:]
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"ONNX shape inference failed ({key_line(exc)}); shapes left to the runtime")
        return model
    return inferred


def _fill_output_shapes(model: onnx.ModelProto, path: Path) -> None:
    """Graph outputs take the shapes onnxruntime infers (onnx's shape inference leaves them blank)."""
    try:
        session = _session(path)
    except Exception:  # noqa: BLE001
        return
    by_name = {o.name: o for o in session.get_outputs()}
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
    """The base's transforms in order (``onnx_prepare.apply_checked`` skips one that breaks the model)."""

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
        Transform("writing the outputs' shapes", fill_output_shapes(_fill_output_shapes)),
    ]


def prepare(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """The fp32 base for an ONNX source: inputs pinned to ``request.input_shapes`` (batch kept dynamic only
    with ``request.dynamic_batch``), Constant weights turned into initializers, nodes named, opset raised to
    what per-channel QDQ needs (never above ``request.max_opset``), shapes inferred, external data folded in.
    Every change is listed in ``notes``."""
    from toolkit.sources.onnx import load_onnx

    onnx = _onnx()
    model = load_onnx(Path(request.source.path))
    notes: list[str] = []

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

    model = apply_checked(model, _base_transforms(request), request, notes, problem_of=_model_problem)
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


# --------------------------------------------------------------------------------------------- derive


def derive(request: ConversionRequest, base: BuiltArtifact, output: Path) -> BuiltArtifact:
    """Build ``request.recipe``'s artifact (fp32 copy, fp16, dynamic int8, static int8) from the fp32 base.

    The artifact is loaded and run once in onnxruntime before it is returned; quantized artifacts must hold
    quantized compute nodes. Any failure raises :class:`ConversionError` and leaves nothing at ``output``.
    """
    recipe = request.recipe
    if recipe.format != "onnx":
        raise UsageError(f"onnx_quant builds ONNX artifacts, not {recipe.format}.")
    request.workdir.mkdir(parents=True, exist_ok=True)
    builders = {"fp32": _fp32, "fp16": _fp16, "dynamic": _dynamic, "int8": _int8}
    with staged_file(output) as tmp:
        float_nodes, notes = builders[recipe.precision](request, base, tmp)
        check_runs(tmp, request, f"{recipe.precision} ONNX")
        if recipe.precision in ("dynamic", "int8"):
            _require_quantized(tmp, recipe.precision)
        if recipe.a16w8:  # the one recipe ORT's quantizer would move to a newer opset
            _require_opset(tmp, request)
    return BuiltArtifact(
        path=output,
        float_nodes=tuple(float_nodes),
        notes=tuple(base.notes) + tuple(notes),
        exporter=base.exporter,
    )


_Result = tuple[list[str], list[str]]  # (float_nodes, notes)


def _fp32(request: ConversionRequest, base: BuiltArtifact, tmp: Path) -> _Result:
    shutil.copyfile(base.path, tmp)
    return [], []


def _overflowing_nodes(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """(nodes reading a float constant that fp16 cannot hold, descriptions of those constants)."""
    from onnx import numpy_helper

    from toolkit.runtimes.inspection.onnx import iter_graphs

    nodes: list[str] = []
    found: list[str] = []
    for graph in iter_graphs(model.graph):
        big: dict[str, float] = {}
        for init in graph.initializer:
            if init.data_type == 1:  # FLOAT
                values = numpy_helper.to_array(init)
                peak = float(np.max(np.abs(values))) if values.size else 0.0
                if peak > FP16_MAX:
                    big[init.name] = peak
        for node in graph.node:
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.HasField("t") and attr.t.data_type == 1:
                        values = numpy_helper.to_array(attr.t)
                        if values.size and float(np.max(np.abs(values))) > FP16_MAX:
                            big[node.output[0]] = float(np.max(np.abs(values)))
        for node in graph.node:
            hits = [name for name in node.input if name in big]
            if hits and node.op_type != "Constant":
                nodes.append(node.name)
                found += [f"{name} (|x| up to {big[name]:.3g})" for name in hits]
    return nodes, sorted(set(found))


def _fp16(request: ConversionRequest, base: BuiltArtifact, tmp: Path) -> _Result:
    onnx = _onnx()
    try:
        from onnxconverter_common import float16
    except ImportError as exc:  # pragma: no cover
        raise MissingDependency("onnxconverter-common", extra="onnx", purpose="fp16 ONNX conversion") from exc
    model = onnx.load(str(base.path))
    blocked, constants = _overflowing_nodes(model)
    notes: list[str] = []
    if blocked:
        # onnxconverter-common casts a blocked node's inputs that have value_info, and then converts (and
        # clips) the renamed initializer anyway; without the value_info entries it leaves them in float32.
        inits = {init.name for init in model.graph.initializer}
        keep = [vi for vi in model.graph.value_info if vi.name not in inits]
        del model.graph.value_info[:]
        model.graph.value_info.extend(keep)
        notes.append(
            f"fp16 overflow caught: {len(constants)} constant(s) exceed the fp16 range ({', '.join(constants[:3])}"
            f'{", ..." if len(constants) > 3 else ""}); plain conversion would clip them ("will be truncated") and '
            f"break the model, so {len(blocked)} node(s) reading them stay float32: {', '.join(blocked[:5])}"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            converted = float16.convert_float_to_float16(
                model, keep_io_types=True, max_finite_val=FP16_MAX, node_block_list=blocked
            )
        except Exception as exc:
            line = key_line(exc)
            raise ConversionError(f"fp16 conversion failed: {line}", hint=_hint_for(line)) from exc
    messages = [str(w.message) for w in caught if "truncated" in str(w.message)]
    clipped = [m for m in messages if f"truncated to {FP16_MAX}" in m or "truncated to -65504" in m]
    tiny = len(messages) - len(clipped)
    if clipped:
        notes.append(f"fp16: {len(clipped)} value(s) clipped to the fp16 range: {clipped[0]}")
    if tiny:
        notes.append(f"fp16: {tiny} weight tensor(s) held values below 1e-7, rounded to +-1e-7")
    save_model(converted, tmp, final_name=tmp.name)
    return blocked, notes


def _nodes_to_exclude(model_path: Path, names: Sequence[str]) -> list[str]:
    if not names:
        return []
    from toolkit.runtimes.inspection.onnx import iter_nodes

    existing = {n.name for n in iter_nodes(_onnx().load(str(model_path), load_external_data=False).graph)}
    unknown = [n for n in names if n not in existing]
    if unknown:
        from toolkit.model.schemas.problems import closest

        close = {n: closest(n, existing) for n in unknown}
        hint = "; ".join(f"{n!r}: did you mean {c!r}?" for n, c in close.items() if c)
        raise ConversionError(
            f"nodes_to_exclude names node(s) that are not in the model: {', '.join(map(repr, unknown))}.",
            hint=hint or "Use node names from `edgetk inspect` or from the per-node error report.",
        )
    return list(names)


def _dynamic(request: ConversionRequest, base: BuiltArtifact, tmp: Path) -> _Result:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    recipe = request.recipe
    exclude = _nodes_to_exclude(base.path, recipe.nodes_to_exclude)
    weight = QuantType.QInt8 if recipe.weight_type == "int8" else QuantType.QUInt8
    from toolkit.runtimes.inspection.onnx import iter_nodes

    notes = []
    # Weights inside If/Loop/Scan bodies (an LSTM in a branch) are quantized only when asked for; a model that
    # onnxruntime then refuses is built again with the subgraphs left float.
    subgraphs = any(n.op_type in ("If", "Loop", "Scan") for n in _onnx().load(str(base.path)).graph.node)
    for enable in ((True, False) if subgraphs else (False,)):
        try:
            with _quiet():
                quantize_dynamic(
                    str(base.path.resolve()),
                    str(tmp.resolve()),
                    weight_type=weight,
                    per_channel=recipe.per_channel,
                    nodes_to_exclude=exclude,
                    extra_options={"EnableSubgraph": enable},
                )
        except Exception as exc:
            line = key_line(exc)
            if enable:
                notes.append(f"dynamic: quantizing inside If/Loop/Scan bodies failed ({line}); they stay float")
                continue
            raise ConversionError(f"Dynamic quantization failed: {line}", hint=_hint_for(line)) from exc
        if enable:
            try:
                check_runs(tmp, request, "dynamic ONNX")
            except ConversionError as exc:
                notes.append(f"dynamic: the model quantized inside If/Loop/Scan bodies fails ({exc.message}); "
                             "they stay float")
                continue
            notes.append("dynamic: weights inside If/Loop/Scan bodies quantized too")
        break

    if any(n.op_type == "ConvInteger" for n in iter_nodes(_onnx().load(str(tmp)).graph)):
        notes.append(
            "dynamic: Conv runs as ConvInteger, which onnxruntime ran up to 6x slower than fp32 on x86 "
            "(findings.md 2); compare the measured latency before shipping it"
        )
    return exclude, notes


class _Reader:
    """onnxruntime's CalibrationDataReader over the request's calibration feeds: the model's inputs only,
    each in the dtype the model declares (int64 token ids stay int64; ORT refuses anything else)."""

    def __init__(self, feeds: Sequence[Mapping[str, np.ndarray]], dtypes: Mapping[str, np.dtype]) -> None:
        self._feeds = feeds
        self._dtypes = dtypes
        self._index = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._index >= len(self._feeds):
            return None
        feed = self._feeds[self._index]
        self._index += 1
        return {name: as_input_dtype(feed[name], dtype) for name, dtype in self._dtypes.items()}

    def rewind(self) -> None:
        self._index = 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        self.rewind()
        while (item := self.get_next()) is not None:
            yield item

    def __len__(self) -> int:
        return len(self._feeds)


def _reader(request: ConversionRequest, model_path: Path, limit: int | None = None) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    onnx = _onnx()
    model = onnx.load(str(model_path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    dtypes = {
        vi.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        for vi in model.graph.input
        if vi.name not in initializers
    }
    feeds = request.calibration[:limit] if limit else request.calibration
    missing = [n for n in dtypes if n not in feeds[0]]
    if missing:
        raise UsageError(f"The calibration data has no samples for input(s) {', '.join(missing)}.")

    class Reader(_Reader, CalibrationDataReader):
        pass

    return Reader(feeds, dtypes)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime.quantization logs warnings on the root logger and via warnings, and drops debug files
    into the working directory: keep stderr readable and the user's directory clean."""
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="edgetk-ort-") as scratch:
            warnings.simplefilter("ignore")
            # symbolic shape inference dumps sym_shape_infer_temp.onnx + a .data file into the cwd on failure
            with contextlib.chdir(scratch):
                yield
    finally:
        root.setLevel(level)


def preprocessed(request: ConversionRequest, base: BuiltArtifact, notes: list[str]) -> Path:
    """``quant_pre_process`` of the base, once per run (every int8 recipe and ``node_errors`` share it).

    Symbolic shape inference fails on some real models (PP-OCRv4: "Incomplete symbolic shape inference"):
    retry without it, and as a last resort quantize the base as it is."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    target = request.workdir / f"{base.path.stem}.preprocessed.onnx"
    marker = target.with_suffix(".notes")
    if target.is_file() and target.stat().st_mtime >= base.path.stat().st_mtime:
        if marker.is_file():
            notes += [line for line in marker.read_text().splitlines() if line]
        return target
    attempts: list[tuple[str, dict[str, Any]]] = [
        ("", {}),
        ("without symbolic shape inference", {"skip_symbolic_shape": True}),
    ]
    local: list[str] = []
    for label, options in attempts:
        partial = target.with_suffix(".partial.onnx")
        try:
            with _quiet():
                quant_pre_process(str(base.path.resolve()), str(partial.resolve()), **options)
            problem = transform_problem(partial, request)
            if problem is not None:
                partial.unlink(missing_ok=True)
                local.append(f"int8 pre-processing {label or 'with symbolic shape inference'} skipped: "
                             f"the model it wrote {problem}")
                continue
            os.replace(partial, target)
            if label:
                local.append(f"int8 pre-processing ran {label}")
            break
        except Exception as exc:  # noqa: BLE001
            partial.unlink(missing_ok=True)
            local.append(
                f"int8 pre-processing {label or 'with symbolic shape inference'} failed: {key_line(exc)}"
            )
    else:
        shutil.copyfile(base.path, target)
        local.append("int8 pre-processing skipped: the base model is quantized as it is")
    marker.write_text("\n".join(local) + "\n")
    notes += local
    return target


def calibration_cache(request: ConversionRequest, source: Path, method: str) -> Path | None:
    """Where ``quantize_static`` keeps the activation ranges of this run's calibration pass, so that every
    static INT8 build of the same model, data and method (the recipe, its selective retries, other
    activation/weight types) calibrates once: ORT's ``calibration_cache_path`` loads the ranges instead of
    running the augmented model over the data again. Keyed by the model file and a digest of the
    calibration feeds (a run's scratch directory, so nothing outlives the run). MinMax only: the method the
    profiles use and the one tested with the cache (tests/conversion/test_onnx_quant.py)."""
    if method != "minmax":
        return None
    import hashlib

    digest = hashlib.sha256()
    stat = source.stat()
    digest.update(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    for feed in request.calibration:
        for name in sorted(feed):
            value = np.ascontiguousarray(feed[name])
            digest.update(f"{name}|{value.dtype}|{value.shape}".encode())
            digest.update(value.tobytes())
    return request.workdir / f"{source.stem}.calibration-{method}-{digest.hexdigest()[:16]}.json"


def _int8(request: ConversionRequest, base: BuiltArtifact, tmp: Path) -> _Result:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    recipe = request.recipe
    if not request.calibration:
        raise UsageError(
            "int8 needs calibration data: representative inputs to measure activation ranges.",
            hint="Pass --calibration PATH (.npy, .npz or an image folder), or ask for --precision dynamic.",
        )
    notes: list[str] = []
    source = preprocessed(request, base, notes).resolve()
    exclude = _nodes_to_exclude(source, recipe.nodes_to_exclude)
    from toolkit.conversion.fragile import onnx_fragile_nodes, upfront_note

    fragile = [(name, why) for name, why in onnx_fragile_nodes(source, request.calibration) if name not in exclude]
    if fragile:
        exclude += [name for name, _ in fragile]
        notes.append(upfront_note(fragile))
    per_channel = recipe.per_channel
    fmt = QuantFormat.QDQ if recipe.quant_format == "qdq" else QuantFormat.QOperator
    opset = opset_of(_onnx().load(str(source), load_external_data=False))
    if per_channel and fmt == QuantFormat.QDQ and opset < QDQ_MIN_OPSET:
        per_channel = False
        notes.append(
            f"per-tensor quantization: opset {opset} has no per-channel DequantizeLinear (needs >= 13)"
        )
    method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[recipe.calibration_method]
    qtype = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8, "int16": QuantType.QInt16}
    contrib = recipe.a16w8 and opset < INT16_QDQ_OPSET
    if contrib:
        notes.append(
            f"A16W8: int16 QuantizeLinear/DequantizeLinear in the com.microsoft domain (ONNX Runtime's "
            f"contrib ops, onnxruntime >= {A16W8_MIN_ONNXRUNTIME}) at the model's opset {opset}; ai.onnx takes "
            f"int16 Q/DQ only from opset {INT16_QDQ_OPSET}"
            + (f", above the target's {request.max_opset}"
               if request.max_opset and request.max_opset < INT16_QDQ_OPSET else ""))
    try:
        with _quiet(), _opset_kept(contrib):
            quantize_static(
                str(source.resolve()),
                str(tmp.resolve()),
                _reader(request, source),
                quant_format=fmt,
                activation_type=qtype[recipe.activation_type],
                weight_type=qtype[recipe.weight_type],
                per_channel=per_channel,
                calibrate_method=method,
                nodes_to_exclude=exclude,
                calibration_cache_path=calibration_cache(request, source, recipe.calibration_method),
                extra_options={"UseQDQContribOps": True} if contrib else None,
            )
    except UsageError:
        raise
    except Exception as exc:
        line = key_line(exc)
        raise ConversionError(
            f"Static int8 quantization ({recipe.label}) failed: {line}", hint=_hint_for(line)
        ) from exc
    if contrib:
        _contrib_only_for_16_bits(tmp)
    return exclude, notes


def _contrib_only_for_16_bits(path: Path) -> None:
    """Move the Q/DQ nodes of 8- and 32-bit tensors (int8 weights, int32 biases) back to the ai.onnx domain.

    ORT's quantizer puts every Q/DQ node of a 16-bit model in the com.microsoft domain; older runtimes'
    contrib DequantizeLinear takes no int32 (the quantized biases: ORT 1.16.3 refuses them), and only the
    int16 activations need the contrib ops."""
    onnx = _onnx()
    from toolkit.runtimes.inspection.onnx import iter_nodes

    model = onnx.load(str(path))
    inits = {t.name: t.data_type for t in model.graph.initializer}
    wide = (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)
    for node in iter_nodes(model.graph):
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or node.domain != "com.microsoft":
            continue
        zero_point = node.input[2] if len(node.input) > 2 and node.input[2] else None
        dtype = inits.get(zero_point) if zero_point else None
        if dtype is None and node.op_type == "DequantizeLinear":
            dtype = inits.get(node.input[0])
        if dtype is not None and dtype not in wide:
            node.domain = ""
    onnx.save(model, str(path))


@contextlib.contextmanager
def _opset_kept(keep: bool) -> Iterator[None]:
    """While ``keep``: ``quantize_static`` leaves the model's opset as it is for 16-bit types.

    onnxruntime >= 1.20 raises a model below opset 21 to 21 before quantizing it to 16 bits (its
    ``update_opset_version``), which the profiles' runtimes cannot load (Pi 4: opset <= 19, ORT 1.16). With the
    opset kept, ORT's own QDQ quantizer takes its pre-21 path: the int16 Q/DQ nodes go to the com.microsoft
    domain (``UseQDQContribOps``), which ORT runs from ``A16W8_MIN_ONNXRUNTIME``. The artifact's opset is
    checked after the build (``_require_opset``)."""
    import importlib

    # the module, not the package's ``quantize`` function of the same name
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
    original = getattr(ort_quantize, "update_opset_version", None)
    if not keep or original is None:
        yield
        return

    def unchanged(model: Any, *args: Any, **kwargs: Any) -> Any:
        return model

    setattr(ort_quantize, "update_opset_version", unchanged)  # noqa: B010 (mypy: untyped module)
    try:
        yield
    finally:
        setattr(ort_quantize, "update_opset_version", original)  # noqa: B010


def _require_opset(path: Path, request: ConversionRequest) -> None:
    """The artifact loads on the target: its ai.onnx opset is at most ``request.max_opset``."""
    opset = opset_of(_onnx().load(str(path), load_external_data=False))
    if request.max_opset is not None and opset > request.max_opset:
        raise ConversionError(
            f"The {request.recipe.label} artifact is opset {opset}; the target loads at most opset "
            f"{request.max_opset}.",
            hint="Pick a target whose ONNX Runtime loads a newer opset, or another --precision.",
        )


def _require_quantized(path: Path, precision: str) -> None:
    from toolkit.runtimes.inspection.onnx import quantized_node_names

    if not quantized_node_names(_onnx().load(str(path))):
        raise ConversionError(
            f"{precision} quantization changed nothing: the model has no operator the quantizer supports "
            "(or all of them were excluded), so it would be a float model under an int8 label.",
            hint="Ship the fp32/fp16 artifact instead, or check nodes_to_exclude.",
        )


# --------------------------------------------------------------------------------------------- node errors


def _rel_error(reference: Sequence[np.ndarray], actual: Sequence[np.ndarray]) -> float:
    ref = np.concatenate([np.asarray(r, dtype=np.float64).ravel() for r in reference])
    act = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in actual])
    if ref.shape != act.shape:
        return math.nan
    return float(np.linalg.norm(ref - act)) / max(float(np.linalg.norm(ref)), 1e-12)


def _qdq_graph(model: onnx.ModelProto) -> tuple[list[Any], dict[str, Any], dict[str, list[Any]]]:
    """(compute nodes fed through a DequantizeLinear, producer of each tensor, readers of each tensor)."""
    from toolkit.runtimes.inspection.onnx import iter_nodes

    nodes = list(iter_nodes(model.graph))
    producers = {out: n for n in nodes for out in n.output}
    readers: dict[str, list[Any]] = {}
    for n in nodes:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    compute = [
        n
        for n in nodes
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
        and n.input
        and producers.get(n.input[0]) is not None
        and producers[n.input[0]].op_type == "DequantizeLinear"
    ]
    return compute, producers, readers


def _output_qdq(node: Any, readers: Mapping[str, list[Any]]) -> tuple[str, str] | None:
    """(float output, its DequantizeLinear output) when ``node``'s first output goes through a Q/DQ pair."""
    if not node.output:
        return None
    for q in readers.get(node.output[0], []):
        if q.op_type == "QuantizeLinear":
            for dq in readers.get(q.output[0], []):
                if dq.op_type == "DequantizeLinear":
                    return str(node.output[0]), str(dq.output[0])
    return None


def _channel_errors(request: ConversionRequest, int8_path: Path, scratch: Path) -> dict[str, float]:
    """Per quantized node: the error its output's Q/DQ pair adds, per channel (axis 1) relative to that
    channel's own magnitude, median over live channels (``sensitivity.ChannelError``)."""
    from toolkit.conversion.sensitivity import DEBUG_SAMPLES, ChannelError

    quant_model = _onnx().load(str(int8_path))
    compute, _producers, readers = _qdq_graph(quant_model)
    pairs = {n.name: pair for n in compute if (pair := _output_qdq(n, readers)) is not None}
    if not pairs:
        return {}
    names = sorted({t for pair in pairs.values() for t in pair})
    feeds = list(_reader(request, int8_path, DEBUG_SAMPLES))
    values = _run_outputs(quant_model, names, scratch, feeds)
    scores: dict[str, float] = {}
    for node, (pre, post) in pairs.items():
        stats = ChannelError(axis=1)
        for before, after in zip(values[pre], values[post]):
            stats.add(before if before.ndim >= 2 else before.reshape(1, -1), after if after.ndim >= 2 else after.reshape(1, -1))
        scores[node] = stats.score()
    return scores


def node_errors(
    request: ConversionRequest, base: BuiltArtifact, int8: BuiltArtifact, *, limit: int
) -> list[tuple[str, float]]:
    """The quantized nodes of a QDQ ``int8`` artifact whose output quantization loses most, worst first.

    For each quantized compute node: the error the Q/DQ pair on its output adds, per channel relative to
    that channel's own magnitude, median over the channels that carry signal (``sensitivity.ChannelError``;
    ~1 = the output is lost, a few percent is normal), over a few calibration samples. A relative L2 error
    over the whole tensor would hide the layer that hurts most (an outlier channel dominates the norm).
    Nodes without an output Q/DQ pair are ranked by ``added_errors``. Names are usable as
    ``nodes_to_exclude``. A QOperator artifact renames its nodes and keeps no float intermediates, so it
    gives an empty list.
    """
    from toolkit.runtimes.inspection.onnx import is_integer_op, iter_nodes

    quant_model = _onnx().load(str(int8.path))
    if any(is_integer_op(n.op_type) for n in iter_nodes(quant_model.graph)) or not request.calibration or limit <= 0:
        return []
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch:
        try:
            with _quiet():
                channel = _channel_errors(request, int8.path, Path(scratch).resolve())
        except Exception as exc:
            line = key_line(exc)
            raise ConversionError(
                f"Measuring per-node quantization error failed: {line}", hint=_hint_for(line)
            ) from exc
    added = added_errors(request, base, int8, limit=0)
    rows = [(name, score) for name, score in channel.items() if not math.isnan(score)]
    rows += [(name, score) for name, score in added if name not in channel or math.isnan(channel[name])]
    rows.sort(key=lambda item: item[1], reverse=True)
    return rows[:limit]


# Ops that move or select values: the compute node behind them is the one that would re-quantize a tensor.
_PASSTHROUGH = {
    "Reshape", "Flatten", "Transpose", "MaxPool", "Squeeze", "Unsqueeze", "Concat", "Relu", "Clip", "Slice",
    "Gather", "Split", "Pad", "Resize", "Identity", "DepthToSpace", "SpaceToDepth", "GlobalMaxPool",
}
_SENSITIVITY_CALIBRATION = 64  # calibration samples for each candidate build (ranges only need to be close)


def float_group_map(quant_model: onnx.ModelProto, names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """For each of ``names`` (quantized nodes of a QDQ model), the node and the compute nodes that read its
    output, through pass-through nodes (``sensitivity.float_group``): what must stay float together."""
    from toolkit.conversion import sensitivity
    from toolkit.runtimes.inspection.onnx import iter_nodes

    compute, _producers, readers = _qdq_graph(quant_model)
    kinds = {n.name: n.op_type for n in compute}
    consumers: dict[str, list[str]] = {}
    for node in [n for n in iter_nodes(quant_model.graph) if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]:
        kinds.setdefault(node.name, node.op_type)
        outputs = list(node.output)
        pair = _output_qdq(node, readers)
        if pair:
            outputs.append(pair[1])
        consumers[node.name] = [
            r.name for out in outputs for r in readers.get(out, []) if r.op_type not in ("QuantizeLinear", "DequantizeLinear")
        ]
    return {name: sensitivity.float_group(name, consumers, lambda n: kinds.get(n) in _PASSTHROUGH) for name in names}


def float_groups(
    request: ConversionRequest, base: BuiltArtifact, int8: BuiltArtifact, *, limit: int
) -> list[tuple[tuple[str, ...], float]]:
    """The groups of nodes worth keeping in float, best first: (node names, output error).

    Shortlists ``sensitivity.MAX_CULPRITS`` nodes by per-channel error (``node_errors``) and by the relative
    error each node adds (``added_errors``), then quantizes the model again with each one alone and with its
    consumers excluded (``sensitivity.float_group``; calibrated on at most 64 samples), runs each on
    ``sensitivity.SENSITIVITY_SAMPLES`` calibration samples and orders them by the relative error of the
    outputs against the fp32 base (0 = as good as float).
    """
    import dataclasses

    from toolkit.conversion import sensitivity

    ranked = node_errors(request, base, int8, limit=10_000)
    if not ranked:
        return []
    added = added_errors(request, base, int8, limit=10_000)
    culprits = sensitivity.shortlist(ranked, added)
    groups = float_group_map(_onnx().load(str(int8.path)), culprits)
    feeds = list(_reader(request, base.path, sensitivity.SENSITIVITY_SAMPLES))
    reference = [[np.asarray(o) for o in _session(base.path).run(None, feed)] for feed in feeds]
    small = dataclasses.replace(request, calibration=request.calibration[:_SENSITIVITY_CALIBRATION])
    measured: dict[tuple[str, ...], float] = {}
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch:
        for index, group in enumerate(sensitivity.candidates(culprits, groups)):
            candidate = dataclasses.replace(small, recipe=dataclasses.replace(request.recipe, nodes_to_exclude=group))
            path = Path(scratch) / f"candidate{index}.onnx"
            try:
                _int8(candidate, base, path)
                session = _session(path)
                outputs = [[np.asarray(o) for o in session.run(None, feed)] for feed in feeds]
            except Exception:  # noqa: BLE001, S112 (a candidate that does not build or run is not a candidate)
                continue
            measured[group] = sensitivity.output_error(reference, outputs)
    return sensitivity.order(measured, limit=limit)


def added_errors(
    request: ConversionRequest, base: BuiltArtifact, int8: BuiltArtifact, *, limit: int
) -> list[tuple[str, float]]:
    """The quantized nodes of a QDQ ``int8`` artifact that add the most error, worst first (all when
    ``limit`` is 0).

    For each quantized compute node: relative L2 error of its output against the float model's, minus the
    largest such error among its inputs (what the node itself adds: its weight and input quantization), over
    a few calibration samples.
    """
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        modify_model_output_intermediate_tensors,
    )

    from toolkit.runtimes.inspection.onnx import is_integer_op, iter_nodes

    onnx = _onnx()
    quant_model = onnx.load(str(int8.path))
    nodes = list(iter_nodes(quant_model.graph))
    if any(is_integer_op(n.op_type) for n in nodes) or not request.calibration or limit < 0:
        return []
    reference = preprocessed(request, base, []).resolve()
    producers = {out: n for n in nodes for out in n.output}

    def float_input(name: str) -> str:
        """The float tensor behind a DequantizeLinear(QuantizeLinear(x)) chain, else the name itself."""
        dq = producers.get(name)
        if dq is not None and dq.op_type == "DequantizeLinear":
            q = producers.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                return str(q.input[0])
        return name

    candidates = [
        n
        for n in nodes
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
        and n.input
        and producers.get(n.input[0]) is not None
        and producers[n.input[0]].op_type == "DequantizeLinear"
    ]
    with tempfile.TemporaryDirectory(dir=request.workdir) as scratch:
        float_aug = Path(scratch).resolve() / "float.aug.onnx"
        quant_aug = Path(scratch).resolve() / "quant.aug.onnx"
        try:
            with _quiet():
                modify_model_output_intermediate_tensors(str(reference.resolve()), str(float_aug))
                modify_model_output_intermediate_tensors(str(int8.path.resolve()), str(quant_aug))
                float_acts = collect_activations(
                    str(float_aug), _reader(request, reference, _MAX_DEBUG_SAMPLES)
                )
                quant_acts = collect_activations(
                    str(quant_aug), _reader(request, reference, _MAX_DEBUG_SAMPLES)
                )
        except Exception as exc:
            line = key_line(exc)
            raise ConversionError(
                f"Measuring per-node quantization error failed: {line}", hint=_hint_for(line)
            ) from exc

    cache: dict[str, float] = {}

    def error(name: str) -> float:
        if name not in cache:
            if name in float_acts and name in quant_acts:
                cache[name] = _rel_error(float_acts[name], quant_acts[name])
            else:
                cache[name] = math.nan
        return cache[name]

    results: list[tuple[str, float]] = []
    for node in candidates:
        out = error(node.output[0]) if node.output else math.nan
        if math.isnan(out):
            continue
        upstream = [error(float_input(name)) for name in node.input if name]
        upstream = [e for e in upstream if not math.isnan(e)]
        added = max(0.0, out - max(upstream, default=0.0))
        results.append((node.name, added))
    results.sort(key=lambda item: item[1], reverse=True)
    return results[:limit] if limit > 0 else results
