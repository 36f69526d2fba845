"""ONNX float base -> fp32 / fp16 / dynamic / int8 artifacts with onnxruntime's own tools (``derive``), whatever
exported the base (see ``registry``). Per-channel QDQ on opset < 13 writes a model onnxruntime refuses
("Unrecognized attribute: axis for operator DequantizeLinear", findings.md 3): static int8 is per-tensor when
the opset must stay old. fp16 conversion clips a BatchNormalization variance of 9.8e7 to 1e4 ("will be
truncated") and the output collapses: the nodes that read a constant fp16 cannot hold stay float32
(``float_nodes`` and the notes).
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.conversion.base import CONV_OPS, MATMUL_OPS, BuiltArtifact, ConversionRequest
from toolkit.conversion.onnx.saturation import REDUCE_RANGE_NOTE
from toolkit.conversion.onnx.calibration import calibration_cache, preprocessed, reader
from toolkit.conversion.onnx.checks import check_runs, failure, first_run_in_child
from toolkit.conversion.onnx.fold import FOLD_STEP, folded_base
from toolkit.conversion.onnx.graph_io import opset_of, quiet, refused_copy, require_onnx, save_model, staged_file
from toolkit.conversion.onnx.prepare import QDQ_MIN_OPSET
from toolkit.conversion.onnx.specialise import specialised_base
from toolkit.errors import ArtifactRefused, ConversionError, MissingDependency, UsageError, key_line
from toolkit.model.vocabulary import (
    A16W8_MIN_ONNXRUNTIME,
    CalibrationMethod,
    Format,
    Precision,
    QuantFormat,
    QuantType,
)

if TYPE_CHECKING:
    import onnx

FP16_MAX = 65504.0
INT16_QDQ_OPSET = 21  # ai.onnx QuantizeLinear/DequantizeLinear take int16 from opset 21 (onnx/onnx#5737)


def derive(request: ConversionRequest, base: BuiltArtifact, output: Path) -> BuiltArtifact:
    """Build ``request.recipe``'s artifact (fp32 copy, fp16, dynamic int8, static int8) from the fp32 base, loaded and
    run once, quantized ones holding quantized compute nodes; any failure leaves nothing at ``output``."""
    recipe = request.recipe
    if recipe.format != Format.ONNX:
        raise UsageError(f"onnx_quant builds ONNX artifacts, not {recipe.format}.")
    request.workdir.mkdir(parents=True, exist_ok=True)
    builders: Mapping[str, Callable[[ConversionRequest, BuiltArtifact, Path], _Result]] = {
        Precision.FP32: _fp32, Precision.FP16: _fp16, Precision.DYNAMIC: _dynamic, Precision.INT8: static_int8}
    if recipe.precision in (Precision.DYNAMIC, Precision.INT8):  # an If an input fixed in the data picks: folded
        base = specialised_base(request, base)
    with staged_file(output) as tmp:
        float_nodes, notes = builders[recipe.precision](request, base, tmp)
        try:
            if recipe.precision in (Precision.DYNAMIC, Precision.INT8):  # quantized kernels: crash in a child first
                first_run_in_child(tmp, request, f"{recipe.precision} ONNX")
            check_runs(tmp, request, f"{recipe.precision} ONNX", artifact=True)
        except ArtifactRefused:  # kept aside: the node onnxruntime names is read from it (runtime_retry)
            shutil.copyfile(tmp, refused_copy(output))
            raise
        if recipe.precision in (Precision.DYNAMIC, Precision.INT8):
            _require_quantized(tmp, recipe.precision, notes)
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

    def peak(tensor: onnx.TensorProto) -> float:  # the largest |value| of a float tensor (0 for others)
        values = numpy_helper.to_array(tensor) if tensor.data_type == 1 else np.zeros(0)  # 1: FLOAT
        return float(np.max(np.abs(values))) if values.size else 0.0

    nodes: list[str] = []
    found: list[str] = []
    for graph in iter_graphs(model.graph):
        constants = [(init.name, init) for init in graph.initializer]
        constants += [(node.output[0], attr.t) for node in graph.node if node.op_type == "Constant"
                      for attr in node.attribute if attr.HasField("t")]
        big = {name: value for name, tensor in constants if (value := peak(tensor)) > FP16_MAX}
        for node in graph.node:
            hits = [name for name in node.input if name in big]
            if hits and node.op_type != "Constant":
                nodes.append(node.name)
                found += [f"{name} (|x| up to {big[name]:.3g})" for name in hits]
    return nodes, sorted(set(found))


def _fp16(request: ConversionRequest, base: BuiltArtifact, tmp: Path) -> _Result:
    onnx = require_onnx()
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
            raise failure("fp16 conversion failed", exc) from exc
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

    existing = {n.name for n in iter_nodes(require_onnx().load(str(model_path), load_external_data=False).graph)}
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
    import onnxruntime.quantization as ortq

    from toolkit.runtimes.inspection.onnx import iter_nodes

    recipe = request.recipe
    exclude = _nodes_to_exclude(base.path, recipe.nodes_to_exclude)
    weight = ortq.QuantType.QInt8 if recipe.weight_type == QuantType.INT8 else ortq.QuantType.QUInt8

    notes: list[str] = []
    # Weights inside If/Loop/Scan bodies (an LSTM in a branch) are quantized once they are the bodies' own
    # initializers (onnx_fold); a model that onnxruntime then refuses is built again with the bodies left float.
    source = folded_base(request, base, notes)
    subgraphs = any(n.op_type in ("If", "Loop", "Scan") for n in require_onnx().load(str(source)).graph.node)
    for enable in ((True, False) if subgraphs else (False,)):
        try:
            with quiet():
                ortq.quantize_dynamic(
                    str(source.resolve()),
                    str(tmp.resolve()),
                    weight_type=weight,
                    per_channel=recipe.per_channel,
                    nodes_to_exclude=exclude,
                    extra_options={"EnableSubgraph": enable},
                )
        except Exception as exc:
            if enable:
                notes.append(f"dynamic: quantizing inside If/Loop/Scan bodies failed ({key_line(exc)}); "
                             "they stay float")
                continue
            raise failure("Dynamic quantization failed", exc) from exc
        if enable:
            try:
                check_runs(tmp, request, "dynamic ONNX")
            except ConversionError as exc:
                notes.append(f"dynamic: the model quantized inside If/Loop/Scan bodies fails ({exc.message}); "
                             "they stay float")
                continue
            notes.append("dynamic: weights inside If/Loop/Scan bodies quantized too")
        break

    if any(n.op_type == "ConvInteger" for n in iter_nodes(require_onnx().load(str(tmp)).graph)):
        notes.append(
            "dynamic: Conv runs as ConvInteger, which onnxruntime ran up to 6x slower than fp32 on x86 "
            "(findings.md 2); compare the measured latency before shipping it"
        )
    return exclude, notes


def static_int8(request: ConversionRequest, base: BuiltArtifact, tmp: Path) -> _Result:
    """Static (calibrated) quantization of the pre-processed base with ``quantize_static``; known-fragile
    nodes (``fragile.onnx_fragile_nodes``) join ``nodes_to_exclude``; ``reduce_range`` (7-bit weights) as the
    recipe says (``onnx.saturation``: x86 CPUs without VNNI saturate 8-bit ones)."""
    import onnxruntime.quantization as ortq

    recipe = request.recipe
    if not request.calibration:
        raise UsageError(
            "int8 needs calibration data: representative inputs to measure activation ranges.",
            hint="Pass --calibration PATH (.npy, .npz or an image folder), or ask for --precision dynamic.",
        )
    notes: list[str] = [REDUCE_RANGE_NOTE] if recipe.reduce_range else []
    source = preprocessed(request, base, notes).resolve()
    exclude = _static_exclusions(request, source, notes)
    opset = opset_of(source)
    per_channel = _per_channel(request, opset, notes)
    contrib = _contrib_ops(request, opset, notes)
    # onnxruntime's own words for the recipe's (Any: onnxruntime is untyped)
    qtype: Mapping[str, object] = {QuantType.INT8: ortq.QuantType.QInt8, QuantType.UINT8: ortq.QuantType.QUInt8,
             QuantType.INT16: ortq.QuantType.QInt16}
    method: Mapping[str, object] = {CalibrationMethod.MINMAX: ortq.CalibrationMethod.MinMax,
              CalibrationMethod.ENTROPY: ortq.CalibrationMethod.Entropy,
              CalibrationMethod.PERCENTILE: ortq.CalibrationMethod.Percentile}
    try:
        with quiet(), _opset_kept(contrib):
            ortq.quantize_static(
                str(source.resolve()),
                str(tmp.resolve()),
                reader(request, source),
                quant_format=ortq.QuantFormat.QDQ if recipe.quant_format == QuantFormat.QDQ
                else ortq.QuantFormat.QOperator,
                activation_type=qtype[recipe.activation_type],
                weight_type=qtype[recipe.weight_type],
                per_channel=per_channel,
                reduce_range=bool(recipe.reduce_range),
                calibrate_method=method[recipe.calibration_method],
                nodes_to_exclude=exclude,
                calibration_cache_path=calibration_cache(request, source, recipe.calibration_method),
                extra_options={"UseQDQContribOps": True} if contrib else None,
            )
    except UsageError:
        raise
    except Exception as exc:
        raise failure(f"Static int8 quantization ({recipe.label}) failed", exc) from exc
    if contrib:
        _contrib_only_for_16_bits(tmp)
    return exclude, notes


def _static_exclusions(request: ConversionRequest, source: Path, notes: list[str]) -> list[str]:
    """The recipe's ``nodes_to_exclude`` (checked against the model), then the known-fragile nodes."""
    from toolkit.conversion.fragile import onnx_fragile_nodes, upfront_note

    exclude = _nodes_to_exclude(source, request.recipe.nodes_to_exclude)
    fragile = [(name, why) for name, why in onnx_fragile_nodes(source, request.calibration) if name not in exclude]
    if fragile:
        exclude += [name for name, _ in fragile]
        notes.append(upfront_note(fragile))
    return exclude


def _per_channel(request: ConversionRequest, opset: int, notes: list[str]) -> bool:
    """The recipe's ``per_channel``, unless QDQ at this opset has no per-channel DequantizeLinear."""
    recipe = request.recipe
    if recipe.per_channel and recipe.quant_format == QuantFormat.QDQ and opset < QDQ_MIN_OPSET:
        notes.append(
            f"per-tensor quantization: opset {opset} has no per-channel DequantizeLinear (needs >= 13)"
        )
        return False
    return recipe.per_channel


def _contrib_ops(request: ConversionRequest, opset: int, notes: list[str]) -> bool:
    """Whether an A16W8 recipe needs ORT's contrib int16 Q/DQ ops (the model's opset is below 21)."""
    contrib = request.recipe.a16w8 and opset < INT16_QDQ_OPSET
    if contrib:
        notes.append(
            f"A16W8: int16 QuantizeLinear/DequantizeLinear in the com.microsoft domain (ONNX Runtime's "
            f"contrib ops, onnxruntime >= {A16W8_MIN_ONNXRUNTIME}) at the model's opset {opset}; ai.onnx takes "
            f"int16 Q/DQ only from opset {INT16_QDQ_OPSET}"
            + (f", above the target's {request.max_opset}"
               if request.max_opset and request.max_opset < INT16_QDQ_OPSET else ""))
    return contrib


def _contrib_only_for_16_bits(path: Path) -> None:
    """Move the Q/DQ nodes of 8- and 32-bit tensors (int8 weights, int32 biases) back to the ai.onnx domain: ORT puts
    every Q/DQ node of a 16-bit model in com.microsoft, older runtimes' contrib DequantizeLinear takes no int32
    (ORT 1.16.3 refuses the biases), and only the int16 activations need the contrib ops."""
    onnx = require_onnx()
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
    """While ``keep``: ``quantize_static`` leaves the model's opset as it is for 16-bit types. onnxruntime >= 1.20
    raises a model below opset 21 to 21 first (``update_opset_version``), which the profiles' runtimes cannot load
    (Pi 4: opset <= 19, ORT 1.16). With the opset kept, ORT's QDQ quantizer takes its pre-21 path: int16 Q/DQ in the
    com.microsoft domain (``UseQDQContribOps``), which ORT runs from ``A16W8_MIN_ONNXRUNTIME``. The artifact's
    opset is checked after the build (``_require_opset``)."""
    import importlib

    # the module, not the package's ``quantize`` function of the same name
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
    original = getattr(ort_quantize, "update_opset_version", None)
    if not keep or original is None:
        yield
        return

    def unchanged(model: Any, *args: Any, **kwargs: Any) -> Any:  # Any: onnxruntime's untyped signature
        return model

    setattr(ort_quantize, "update_opset_version", unchanged)  # noqa: B010 (mypy: untyped module)
    try:
        yield
    finally:
        setattr(ort_quantize, "update_opset_version", original)  # noqa: B010


def _require_opset(path: Path, request: ConversionRequest) -> None:
    """The artifact loads on the target: its ai.onnx opset is at most ``request.max_opset``."""
    opset = opset_of(path)
    if request.max_opset is not None and opset > request.max_opset:
        raise ConversionError(
            f"The {request.recipe.label} artifact is opset {opset}; the target loads at most opset "
            f"{request.max_opset}.",
            hint="Pick a target whose ONNX Runtime loads a newer opset, or another --precision.",
        )


def _require_quantized(path: Path, precision: str, notes: Sequence[str]) -> None:
    """The artifact holds quantized compute nodes; when its weighted nodes all sit inside If/Loop/Scan bodies the
    refusal says so, and why they stayed float (static QDQ never enters a body; dynamic names its failure)."""
    from collections import Counter

    from toolkit.runtimes.inspection.onnx import iter_nodes, quantized_node_names

    model = require_onnx().load(str(path))
    if quantized_node_names(model):
        return
    weighted = MATMUL_OPS | CONV_OPS
    nested = Counter(n.op_type for n in iter_nodes(model.graph) if n.op_type in weighted)
    if nested and not any(n.op_type in weighted for n in model.graph.node):
        why = next((n.removeprefix("dynamic: ").removesuffix("; they stay float") for n in notes
                    if n.startswith(("dynamic: ", FOLD_STEP)) and "inside If/Loop/Scan bodies" in n),
                   "onnxruntime's static quantizer does not enter such bodies")
        ops = ", ".join(f"{count} {op}" for op, count in sorted(nested.items()))
        raise ConversionError(
            f"{precision} quantization changed nothing: every operator it would quantize ({ops}) sits inside an "
            f"If/Loop/Scan body, and {why}; it would be a float model under an int8 label.",
            hint="Ship the fp32/fp16 artifact; if an input picks the branch (a sample rate), fix it with "
            "--input-value NAME=VALUE; or quantize an export of the model without the control flow around its layers.",
        )
    raise ConversionError(
        f"{precision} quantization changed nothing: the model has no operator the quantizer supports "
        "(or all of them were excluded), so it would be a float model under an int8 label.",
        hint="Ship the fp32/fp16 artifact instead, or check nodes_to_exclude.",
    )
