"""Keras / SavedModel -> TFLite: fp32, fp16, dynamic range, and full int8 from calibration data.

Route (findings.md): the source is exported once to a SavedModel with the requested input shapes pinned
(``keras.export.ExportArchive`` for Keras 3, which freezes the variables correctly) and converted with
``TFLiteConverter.from_saved_model``. ``from_concrete_functions`` on a live Keras 3 model yields NaN models;
every artifact therefore passes a sanity run (``sanity_check``) on one calibration sample before it is
written, and a non-finite output stops the conversion with a :class:`ConversionError`.

Full int8 takes ``request.recipe.io_dtype`` (int8 by default, uint8, or float32 I/O). A16W8 (``activation_type
= "int16"``: 16-bit activations, 8-bit weights) is the converter's own
``EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8`` build with float I/O (``_a16w8``): TF's
converter quantizes 16x8 with its calibrate-and-quantize path, not the MLIR quantizer the cached calibration
feeds, so it calibrates once more for itself. Selective
quantization (``recipe.nodes_to_exclude``) goes through the MLIR quantizer the TFLite quantization debugger
uses: the model is calibrated once, then quantized with those nodes (op output tensor names, Keras layer
names, or builtin op names such as ``FULLY_CONNECTED``) denylisted, so they stay float.
``layer_errors`` ranks layers by their quantization error relative to each channel's own magnitude, and
``float_groups`` orders candidate groups of layers by what keeping them in float does to the model's outputs
(``toolkit.conversion.sensitivity``), so the pipeline can pick which to keep in float.

A run calibrates once (``_calibrated``, kept per source, calibration set, per-channel and pinned shapes): the
full int8 artifact, the layer table, the fragile-pattern pass and every selective rebuild quantize that one
calibrated model, as the converter itself does after calibrating; the quantization parameters are those of a
fresh calibration.

Nothing is ever left half-written at ``output``: the model is written to a temporary file next to it and
renamed only after the sanity run passed.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import logging
import math
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.conversion import fragile
from toolkit.conversion.base import BuiltArtifact, ConversionRequest, as_input_dtype
from toolkit.errors import ConversionError, UsageError
from toolkit.model.artifact import FloatIO
from toolkit.model.vocabulary import FloatIOReason, TensorRole

_IO_TYPES = {"int8": "int8", "uint8": "uint8", "float32": "float32"}
INT8_LEVELS = 255.0  # an int8 tensor's range in quantization steps


def _tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    return tf


def _key_line(exc: BaseException) -> str:
    """The converter's key line out of an exception text that may hold a whole MLIR dump or traceback."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in lines:
        if "error:" in ln.lower():
            return ln[ln.lower().index("error:") :][:300]
    useful = [ln for ln in lines if not ln.startswith(("File ", "Traceback", "^", "~", "<unknown>", "note:"))]
    text = useful[0] if useful else type(exc).__name__
    return text[:300]


def _source(request: ConversionRequest) -> Any:
    from toolkit.sources.tensorflow import TensorFlowSource

    source = request.source
    if not isinstance(source, TensorFlowSource):
        raise UsageError(
            f"The TFLite route converts Keras and SavedModel sources, not {source.framework}.",
            hint="Use the route for that framework.",
        )
    return source


def fixed_saved_model(request: ConversionRequest) -> Path:
    """The source exported once per workdir as a SavedModel with ``request.input_shapes`` pinned."""
    source = _source(request)
    shapes = {s.name: tuple(request.input_shapes.get(s.name, s.shape)) for s in source.inputs}
    for spec in source.inputs:
        if any(d is None for d in shapes[spec.name]):
            raise UsageError(
                f"Input {spec.name!r} has dynamic dimensions {shapes[spec.name]}; the TFLite route needs them fixed.",
                hint=f"Give --input-shape {spec.name}=D0,D1,... or calibration data that fixes them.",
            )
    identity = (source.framework, str(Path(source.path).resolve()), sorted(shapes.items()))
    key = hashlib.sha256(repr(identity).encode()).hexdigest()[:12]
    directory = request.workdir / f"tflite-savedmodel-{key}"
    if (directory / "saved_model.pb").is_file():
        return directory
    request.workdir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="export-", dir=request.workdir))
    target = staging / "model"
    source.export_saved_model(target, shapes)
    os.replace(target, directory)
    staging.rmdir()
    return directory


def _representative(request: ConversionRequest, limit: int | None = None) -> Any:
    source = _source(request)
    samples = list(request.calibration[:limit] if limit else request.calibration)

    def generate() -> Iterator[dict[str, np.ndarray]]:
        for feed in samples:
            yield {s.name: as_input_dtype(feed[s.name], s.dtype) for s in source.inputs}

    return generate


def _require_calibration(request: ConversionRequest) -> None:
    if not request.calibration:
        raise UsageError(
            "Full int8 TFLite conversion needs calibration data.",
            hint="Pass --calibration PATH (.npy/.npz/image folder), or ask for --precision dynamic.",
        )


def _converter(request: ConversionRequest) -> Any:
    """The converter of ``request.recipe``; for int8 it calibrates (``_calibrated``), the quantizer runs apart."""
    tf = _tf()
    recipe = request.recipe
    converter = tf.lite.TFLiteConverter.from_saved_model(str(fixed_saved_model(request)))
    if recipe.precision == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif recipe.precision == "dynamic":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif recipe.precision == "int8":
        _require_calibration(request)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _representative(request)
        if not recipe.per_channel:
            converter._experimental_disable_per_channel = True
    return converter


@dataclasses.dataclass(frozen=True)
class _Calibration:
    """One calibration of a source on one calibration set: the float model with the recorded tensor ranges."""

    source: Any
    calibration: Sequence[Mapping[str, np.ndarray]]
    per_channel: bool
    saved_model: str
    model: bytes


_CACHE: list[_Calibration] = []  # the calibrations of this process, newest last
_CACHE_SIZE = 4  # recipes of one run differ in per_channel at most; each entry is a float model's size


def _calibrated(request: ConversionRequest) -> bytes:
    """The source calibrated on ``request.calibration`` (``_experimental_calibrate_only``), once per run.

    The plain INT8 layer table, the fragile-pattern pass and every selective rebuild quantize from it with
    ``mlir_quantize`` (what the quantization debugger does), so a run calibrates once, not once per build.
    Calibration ignores the recipe's float nodes and I/O types: only the source, the calibration samples
    (the same objects: requests of one run share them), per-channel and the pinned shapes (the SavedModel
    export) decide it.
    """
    _require_calibration(request)
    saved_model = str(fixed_saved_model(request))
    per_channel = bool(request.recipe.per_channel)
    for entry in _CACHE:
        if (entry.source is request.source and entry.calibration is request.calibration
                and entry.per_channel == per_channel and entry.saved_model == saved_model):
            return entry.model
    converter = _converter(request)
    converter.experimental_mlir_quantizer = True  # what the debugger sets for its calibration
    converter._experimental_calibrate_only = True
    model = _run(converter, "int8 calibration")
    _CACHE[:] = [*_CACHE[-(_CACHE_SIZE - 1):], _Calibration(request.source, request.calibration, per_channel,
                                                           saved_model, model)]
    return model


def _full_int8(request: ConversionRequest, calibrated: bytes) -> bytes:
    """Full INT8 from the run's calibration with the recipe's I/O type: what ``TFLiteConverter.convert()`` does
    after calibrating (lite.py ``_quantize``: ``mlir_quantize`` with the I/O types, then the read-only buffers
    deduplicated), so the artifact is the one the converter builds, without calibrating again."""
    tf = _tf()
    from tensorflow.lite.python import convert as tf_convert
    from tensorflow.lite.python.lite import _deduplicate_readonly_buffers

    recipe = request.recipe
    io_type = tf.as_dtype(_IO_TYPES[recipe.io_dtype])
    try:
        model = tf_convert.mlir_quantize(calibrated, disable_per_channel=not recipe.per_channel,
                                         input_data_type=io_type, output_data_type=io_type)
        return bytes(_deduplicate_readonly_buffers(bytes(model)))
    except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(
            f"TFLiteConverter failed (int8): {_key_line(exc)}",
            hint="The model may use ops TFLite cannot express in int8; try another precision, or keep the "
            "failing layers in float with nodes_to_exclude.",
        ) from None


def _a16w8(request: ConversionRequest) -> bytes:
    """16-bit activations, 8-bit weights, float I/O: the converter's 16x8 ops set (reference kernels in LiteRT,
    no XNNPACK: accuracy and 4x smaller weights, not speed). No builtin falls back to float (no
    ``TFLITE_BUILTINS`` beside it): an op without a 16x8 kernel fails the build and says so."""
    tf = _tf()
    converter = _converter(request)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    return _run(converter, "A16W8")


def _run(converter: Any, what: str) -> bytes:
    try:
        return bytes(converter.convert())
    except Exception as exc:  # the converter raises ConverterError, ValueError, RuntimeError...  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(
            f"TFLiteConverter failed ({what}): {_key_line(exc)}",
            hint="The model may use ops TFLite cannot express in this precision; try another precision, or "
            "keep the failing layers in float with nodes_to_exclude.",
        ) from None


# --------------------------------------------------------------------------------------------- selective


def _op_outputs(model: bytes, workdir: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(builtin op name, output tensor names) of every op of ``model``."""
    from toolkit.runtimes.inspection.tflite import parse_tflite

    with tempfile.NamedTemporaryFile(suffix=".tflite", dir=workdir, delete=False) as handle:
        handle.write(model)
    try:
        return [(op.name, op.output_names) for op in parse_tflite(Path(handle.name)).ops]
    finally:
        os.unlink(handle.name)


def _layer_scopes(tensor_names: Sequence[str], layers: Sequence[str]) -> dict[str, set[str]]:
    """Keras layer name -> the name scopes its ops got in the exported graph.

    TensorFlow uniquifies scopes (layer ``conv2d`` may become ``conv2d_1`` and layer ``conv2d_1`` become
    ``conv2d_1_2``), so a scope is assigned to a layer only once it has a single candidate left.
    """
    scopes = {comp for name in tensor_names for part in name.split(";") for comp in part.split("/")[:-1]}

    def candidates(scope: str, free: set[str]) -> list[str]:
        return [l for l in free if scope == l or re.fullmatch(re.escape(l) + r"_\d+", scope)]

    free = set(layers)
    pending = {s for s in scopes if candidates(s, free)}
    result: dict[str, set[str]] = {}
    progress = True
    while progress and pending:
        progress = False
        for scope in sorted(pending):
            options = candidates(scope, free)
            if len(options) == 1:
                result.setdefault(options[0], set()).add(scope)
                free.discard(options[0])
                pending.discard(scope)
                progress = True
            elif not options:
                pending.discard(scope)
    return result


def resolve_nodes(
    requested: Sequence[str], ops: Sequence[tuple[str, tuple[str, ...]]], layers: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """Map ``nodes_to_exclude`` entries to (denylisted node tensor names, denylisted op types).

    An entry is an op's output tensor name (what ``layer_errors`` returns), a builtin op name
    (``FULLY_CONNECTED``), or a Keras layer name (``dense_1``, given in ``layers``), matched against the name
    scopes inside the tensor names.
    """
    tensor_names = [name for _, outs in ops for name in outs]
    op_types = {op for op, _ in ops}
    scope_map = _layer_scopes(tensor_names, layers)
    nodes: list[str] = []
    types: list[str] = []
    unknown: list[str] = []
    for entry in requested:
        if entry in tensor_names:
            nodes.append(entry)
            continue
        # The debugger reports some names with an index appended (``.../Squeeze1``).
        prefixed = [n for n in tensor_names if entry.startswith(n) and entry[len(n) :].isdigit()]
        if prefixed:
            nodes.append(max(prefixed, key=len))
            continue
        if entry in op_types:
            types.append(entry)
            continue
        scopes = scope_map.get(entry) or {entry}
        matched = [
            name
            for name in tensor_names
            if any(comp in scopes for part in name.split(";") for comp in part.split("/")[:-1])
        ]
        if matched:
            nodes.extend(m for m in matched if m not in nodes)
        else:
            unknown.append(entry)
    if unknown:
        sample = ", ".join(sorted({n.split(";")[0] for n in tensor_names})[:8])
        raise UsageError(
            f"nodes_to_exclude names nodes this model does not have: {', '.join(unknown)}.",
            hint=f"Use op output tensor names (e.g. {sample}), Keras layer names, or op types such as "
            "FULLY_CONNECTED.",
        )
    return nodes, types


def _int8_params(low: float, high: float) -> tuple[float, int]:
    """(scale, zero point) of an int8 tensor covering [low, high] (and 0), as the TFLite quantizer sets them."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = (high - low) / INT8_LEVELS if high > low else 1.0
    return scale, int(min(127, max(-128, round(-128 - low / scale))))


def _tensor_ranges(calibrated: bytes) -> dict[str, tuple[float, float]]:
    """Tensor name -> the (min, max) the calibration recorded on it (main graph)."""
    from tensorflow.lite.python import util as tf_util

    graph = tf_util._convert_model_from_bytearray_to_object(calibrated).subgraphs[0]
    ranges = {}
    for tensor in graph.tensors or []:
        q = tensor.quantization
        if q is not None and q.min is not None and q.max is not None and len(q.min) == 1 and len(q.max) == 1:
            ranges[_text(tensor.name)] = (float(q.min[0]), float(q.max[0]))
    return ranges


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def int8_borders(
    model: bytes, calibrated: bytes, *, keep_float: Mapping[str, tuple[FloatIOReason, str]] | None = None
) -> tuple[bytes, tuple[FloatIO, ...]]:
    """Give every float I/O tensor of ``model`` whose neighbouring op is kept float a QUANTIZE -> DEQUANTIZE pair
    at the border, so that ``modify_model_io_type`` can make that I/O integer: the float island then sits inside
    the graph (int8 input -> DEQUANTIZE -> float ops -> QUANTIZE -> int8 output), with the scale the calibration
    measured on that tensor, the one full INT8 would have given it.

    ``keep_float`` names I/O tensors (source input/output names or tensor names) that must stay float, with why
    (an output that mixes ranges: one int8 scale would flatten its small part). Returns the model and the I/O
    that stays float, with the reason; the caller records those in the artifact (``FloatIO``).
    """
    from tensorflow.lite.python import schema_py_generated as fb
    from tensorflow.lite.python import util as tf_util

    obj = tf_util._convert_model_from_bytearray_to_object(model)
    graph = obj.subgraphs[0]
    tensors = graph.tensors
    ranges = _tensor_ranges(calibrated)
    signature = obj.signatureDefs[0] if obj.signatureDefs else None
    public = {}  # tensor index -> the signature's (source) name
    if signature is not None:
        for item in [*(signature.inputs or []), *(signature.outputs or [])]:
            public[int(item.tensorIndex)] = _text(item.name)
    wanted = dict(keep_float or {})

    def opcode(code: int) -> int:
        for index, op_code in enumerate(obj.operatorCodes):
            if max(int(op_code.builtinCode), int(op_code.deprecatedBuiltinCode)) == code:
                return index
        new = fb.OperatorCodeT()
        new.builtinCode = new.deprecatedBuiltinCode = code
        new.version = 2 if code == fb.BuiltinOperator.DEQUANTIZE else 1  # int8 DEQUANTIZE is version 2
        obj.operatorCodes.append(new)
        return len(obj.operatorCodes) - 1

    def add_tensor(like: Any, name: str, *, int8: tuple[float, int] | None) -> int:
        tensor = fb.TensorT()
        tensor.name = name.encode()
        tensor.shape = like.shape
        tensor.shapeSignature = like.shapeSignature
        tensor.buffer = 0
        tensor.type = fb.TensorType.INT8 if int8 else fb.TensorType.FLOAT32
        if int8:
            tensor.quantization = fb.QuantizationParametersT()
            tensor.quantization.scale, tensor.quantization.zeroPoint = [int8[0]], [int8[1]]
        tensors.append(tensor)
        return len(tensors) - 1

    def add_op(code: int, source: int, target: int) -> Any:
        op = fb.OperatorT()
        op.opcodeIndex = opcode(code)
        op.inputs, op.outputs = [source], [target]
        return op

    quantize, dequantize = fb.BuiltinOperator.QUANTIZE, fb.BuiltinOperator.DEQUANTIZE
    kind = [max(int(obj.operatorCodes[op.opcodeIndex].builtinCode),
                int(obj.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode)) for op in graph.operators]
    stays: list[FloatIO] = []
    front: list[Any] = []
    back: list[Any] = []
    for role, indices in ((TensorRole.INPUT, list(graph.inputs)), (TensorRole.OUTPUT, list(graph.outputs))):
        for index in map(int, indices):
            tensor = tensors[index]
            name = public.get(index, _text(tensor.name))
            if tensor.type != fb.TensorType.FLOAT32:
                continue
            readers = [op for op in graph.operators if index in list(op.inputs)]
            if role is TensorRole.INPUT:
                floats = [op for op, k in zip(graph.operators, kind) if op in readers and k != quantize]
                border = bool(floats)
            else:
                producer = [k for op, k in zip(graph.operators, kind) if index in list(op.outputs)]
                border = bool(producer) and producer[0] != dequantize
            if not border:
                continue
            why = wanted.get(name, wanted.get(_text(tensor.name)))
            if why is None and _text(tensor.name) not in ranges:
                why = (FloatIOReason.NO_RANGE, "the calibration recorded no range for it, so it has no int8 scale")
            if why is not None:
                stays.append(FloatIO(name=name, role=role, reason=why[0], detail=why[1]))
                continue
            params = _int8_params(*ranges[_text(tensor.name)])
            if role is TensorRole.INPUT:
                quantized = [op for op, k in zip(graph.operators, kind) if op in readers and k == quantize]
                if quantized:  # the quantized readers' QUANTIZE gives the int8 tensor; move it first
                    graph.operators.remove(quantized[0])
                    front.append(quantized[0])
                    q_index = int(quantized[0].outputs[0])
                else:
                    q_index = add_tensor(tensor, _text(tensor.name), int8=params)
                    front.append(add_op(quantize, index, q_index))
                f_index = add_tensor(tensor, f"{_text(tensor.name)}/dequantized", int8=None)
                front.append(add_op(dequantize, q_index, f_index))
                for op in floats:
                    op.inputs = [f_index if int(i) == index else int(i) for i in op.inputs]
            else:
                f_index = add_tensor(tensor, f"{_text(tensor.name)}/float", int8=None)
                for op in graph.operators:
                    op.outputs = [f_index if int(i) == index else int(i) for i in op.outputs]
                    op.inputs = [f_index if int(i) == index else int(i) for i in op.inputs]
                q_index = add_tensor(tensor, _text(tensor.name), int8=params)
                back += [add_op(quantize, f_index, q_index), add_op(dequantize, q_index, index)]
    graph.operators = front + list(graph.operators) + back
    return bytes(tf_util._convert_model_from_object_to_bytearray(obj)), tuple(stays)


def _selective_int8(
    request: ConversionRequest, *, only_if_fragile: bool = False
) -> tuple[bytes, list[str], tuple[FloatIO, ...], list[tuple[str, str]]] | None:
    """Calibrate once, then quantize with the requested nodes and the known-fragile ones (``fragile``) denylisted
    (kept float); integer I/O stays integer through ``int8_borders`` except an output a mixed-range Concat
    writes. Returns (model, denylisted names, I/O left float with why, fragile (node, why)); None when
    ``only_if_fragile`` and no fragile pattern was found (the plain conversion stands)."""
    tf = _tf()
    from tensorflow.lite.python import convert as tf_convert  # the quantizer the debugger uses
    from tensorflow.lite.python import util as tf_util

    recipe = request.recipe
    calibrated = _calibrated(request)
    found, float_outputs = fragile.tflite_fragile_nodes(calibrated)
    if only_if_fragile and not found:
        return None
    model_obj = getattr(request.source, "model", None)
    layers = [str(layer.name) for layer in getattr(model_obj, "layers", [])]
    nodes, types = resolve_nodes(recipe.nodes_to_exclude, _op_outputs(calibrated, request.workdir), layers)
    nodes += [name for name, _ in found if name not in nodes]
    keep_float_io = {name: (FloatIOReason.MIXED_RANGES, why) for name, why in float_outputs.items()}
    stays: tuple[FloatIO, ...] = ()
    try:
        model = tf_convert.mlir_quantize(
            calibrated,
            disable_per_channel=not recipe.per_channel,
            fully_quantize=False,
            denylisted_nodes=nodes or None,
            denylisted_ops=types or None,
        )
        if recipe.io_dtype != "float32":
            model, stays = int8_borders(bytes(model), calibrated, keep_float=keep_float_io)
            io_type = tf.as_dtype(_IO_TYPES[recipe.io_dtype])
            # its warning that an I/O "will default to the original type" says what ``stays`` records
            absl = logging.getLogger("absl")
            level = absl.level
            absl.setLevel(logging.ERROR)
            try:
                model = tf_util.modify_model_io_type(model, io_type, io_type)
            finally:
                absl.setLevel(level)
    except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(
            f"Selective int8 quantization failed: {_key_line(exc)}",
            hint="Keep fewer nodes in float, or use io_dtype float32.",
        ) from None
    return bytes(model), nodes + types, stays, found


def _has_decomposition(model: bytes) -> bool:
    """Whether the model has a decomposed LayerNorm/GELU: the statistics rule's candidates."""

    return fragile.tflite_has_decomposition(model)


def _reads_integer_input(model: bytes) -> bool:
    """Whether the model has an integer input (token ids): the integer-input rule's candidates."""

    return bool(fragile.tflite_integer_inputs(model))


def _has_output_concat(model: bytes) -> bool:
    """Whether a Concat reaches a graph output through pass-through ops only (the fragile rule's candidates):
    the cheap structural test that decides whether a calibration is spent on measuring its input ranges."""

    ops, outputs, _magnitude, _constants = fragile._tflite_graph(model)
    readers: dict[str, list[str]] = {}
    for kind, ins, _outs in ops:
        for name in ins:
            readers.setdefault(name, []).append(kind)
    writes = {out: (kind, ins) for kind, ins, outs in ops for out in outs}
    for name in outputs:
        current = name
        while current in writes:
            kind, ins = writes[current]
            if kind == "CONCATENATION":
                return True
            if kind not in fragile.TFLITE_PASSTHROUGH and kind not in ("QUANTIZE", "DEQUANTIZE") or not ins:
                break
            current = ins[0]
    return False


# --------------------------------------------------------------------------------------------- checks


def sanity_check(path: Path, request: ConversionRequest) -> None:
    """Run the artifact once (first calibration sample, or zeros) and refuse non-finite outputs.

    This is what catches the silent NaN models that some converter entry points produce (uninitialised
    variables), before such a file is ever written where the pipeline would ship it.
    """
    from toolkit.runtimes.execution.tflite import TFLiteSession

    try:
        session = TFLiteSession(path)
    except UsageError as exc:
        raise ConversionError(f"The converted model does not load in LiteRT: {exc.message}") from None
    try:
        feed = {}
        for spec in session.inputs:
            sample = request.calibration[0].get(spec.name) if request.calibration else None
            shape = tuple(d if d is not None else 1 for d in spec.shape)
            feed[spec.name] = (
                np.asarray(sample) if sample is not None else np.zeros(shape, np.dtype(spec.dtype))
            )
        try:
            outputs = session.run(feed)
        except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
            raise ConversionError(f"The converted model fails to run in LiteRT: {_key_line(exc)}") from None
    finally:
        session.close()
    bad = [spec.name for spec, out in zip(session.outputs, outputs) if not np.all(np.isfinite(out))]
    if bad:
        raise ConversionError(
            f"The converted TFLite model gives non-finite outputs (NaN/Inf) for {', '.join(bad)} on a valid "
            "input: the converter did not carry the weights (uninitialised variables, the failure of "
            "from_concrete_functions on Keras 3 models) or the quantization overflowed.",
            hint="Convert from the Keras file or a SavedModel export (the toolkit's route); if it persists, keep "
            "the overflowing layers in float.",
        )


def _unasked_float(path: Path, asked: Sequence[str]) -> list[str]:
    """A note naming the ops a mixed int8/float build left float without being asked (the MLIR quantizer in
    mixed mode keeps an op float where it has no int8 kernel, and the pass-through ops between float ops), so
    no op is float silently; none when every float op was asked for (by name or op type)."""
    from collections import Counter

    from toolkit.runtimes.inspection.tflite import float_ops

    wanted = set(asked)
    unasked = Counter(kind for kind, name in float_ops(path) if name not in wanted and kind not in wanted)
    if not unasked:
        return []
    kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(unasked.items()))
    return [f"also float without being asked ({sum(unasked.values())} op(s): no int8 kernel in the quantizer's "
            f"mixed mode, or between float ops): {kinds}"]


def _check_int8(path: Path, io_dtype: str = "float32", float_io: Sequence[FloatIO] = ()) -> None:
    from toolkit.runtimes.inspection.tflite import inspect_tflite

    info = inspect_tflite(path)
    if info.quantized_ops == 0:
        raise ConversionError(
            "int8 quantization changed nothing: the converted model has no operator computing in integer.",
            hint="The model's ops may have no int8 kernels; use fp16 or dynamic instead.",
        )
    # The quantizer silently leaves an I/O float when the op next to it is float ("inference_input_type will
    # default to the original type"): an Edge TPU or an integer-only pipeline would get a model it cannot feed.
    # ``int8_borders`` prevents that; an I/O that still is not ``io_dtype`` must be one it recorded, with why.
    recorded = {f.name for f in float_io}
    wrong = [f"{spec.name} is {spec.dtype}" for spec in (*info.inputs, *info.outputs)  # token ids stay integers
             if spec.dtype == "float32" and spec.name not in recorded]
    if io_dtype != "float32" and wrong:
        raise ConversionError(
            f"The int8 model's I/O is not {io_dtype} as the recipe asks: {', '.join(wrong)} (a layer next to it "
            "is kept in float).",
            hint="Keep fewer layers next to the inputs/outputs in float, or use io_dtype float32.",
        )


# --------------------------------------------------------------------------------------------- route


def convert(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """Build ``request.recipe`` (format tflite) at ``output``; never leaves a partial file there."""
    recipe = request.recipe
    if recipe.format != "tflite":
        raise UsageError(f"The TFLite route cannot build {recipe.format} artifacts.")
    notes: list[str] = []
    float_nodes: tuple[str, ...] = ()
    float_io: tuple[FloatIO, ...] = ()
    selective = None
    if recipe.a16w8 and recipe.nodes_to_exclude:
        raise UsageError("A16W8 TFLite keeps no layers in float: the 16x8 converter takes no denylist.",
                         hint="Leave nodes_to_exclude empty for the A16W8 recipe.")
    if recipe.precision == "int8" and recipe.nodes_to_exclude:
        _require_calibration(request)
        selective = _selective_int8(request)
    elif recipe.a16w8:
        model = _a16w8(request)
    elif recipe.precision == "int8":
        model = _full_int8(request, _calibrated(request))
        if _has_output_concat(model) or _reads_integer_input(model) or _has_decomposition(model):
            selective = _selective_int8(request, only_if_fragile=True)
    else:
        model = _run(_converter(request), recipe.precision)
    if selective is not None:
        model, resolved, float_io, found = selective
        float_nodes = tuple(dict.fromkeys([*recipe.nodes_to_exclude, *(name for name, _ in found)]))
        if found:
            notes.append(fragile.upfront_note(found))
        if recipe.nodes_to_exclude:
            notes.append(f"kept in float: {', '.join(resolved)}")
        notes += [f"{f.role} {f.name!r} stays float32 ({f.reason}): {f.detail}" for f in float_io]
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(model)
        # LiteRT picks the format from the content, but TFLiteSession wants the real model file.
        sanity_check(tmp, request)
        if selective is not None:
            notes += _unasked_float(tmp, resolved)
        if recipe.precision == "int8":
            _check_int8(tmp, recipe.io_dtype if float_nodes else "float32", float_io)
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    exporter = "TFLiteConverter.from_saved_model (keras.export.ExportArchive)"
    if float_nodes:
        exporter = "TFLiteConverter calibration + MLIR quantizer with denylisted nodes"
    elif recipe.a16w8:
        exporter += ", 16x8 calibrate-and-quantize (int16 activations, int8 weights)"
    elif recipe.precision == "int8":
        exporter += ", calibration + MLIR quantizer"
    return BuiltArtifact(path=output, float_nodes=float_nodes, notes=tuple(notes), exporter=exporter,
                         float_io=float_io)


def _debug_run(request: ConversionRequest) -> tuple[bytes, dict[str, float], dict[str, float]]:
    """One TFLite quantization-debugger run: (calibrated model, per-channel error, error in steps) per op
    output tensor name.

    The debugger runs every quantized op next to a float copy fed the same (dequantized) input, so each
    op's own error is measured, not what it inherited. ``layer_direct_compare_metrics`` hands our function the
    float and quantized outputs but not the tensor's name; the debugger calls it in the order of its
    ``layer_statistics`` keys for every sample, which maps the calls back to names.

    The debugger is given the instrumented model (``quant_debug_model_content``), not the converter: built
    from a converter it opens its interpreter without ``experimental_preserve_all_tensors``, and reads the
    float and quantized tensors only after ``invoke()``, from an arena that later ops have reused by then
    (the float copy of the last layer before the output read back zeros in its first elements, so a healthy
    logits layer ranked first with channel error 1.0). Its own NumericVerify differences are computed during
    ``invoke()`` and were right either way.
    """
    tf = _tf()
    from tensorflow.lite.python import convert as tf_convert

    from toolkit.conversion.sensitivity import DEBUG_SAMPLES, ChannelError

    calibrated = _calibrated(request)
    source = _source(request)
    samples = list(request.calibration[:DEBUG_SAMPLES])
    holder: dict[str, Any] = {}
    calls: list[ChannelError] = []

    def channel_error(floats: np.ndarray, quants: np.ndarray, scale: float, zero_point: int) -> float:
        stats = ChannelError(axis=-1)
        values = np.asarray(quants)
        if np.issubdtype(values.dtype, np.integer):
            values = (values.astype(np.float64) - float(zero_point)) * float(scale)
        stats.add(floats, values)
        calls.append(stats)
        return 0.0

    def debug_dataset() -> Iterator[list[np.ndarray]]:
        # The debugger feeds lists in its interpreter's input order (tensor names such as
        # ``serving_default_image:0``); map them back to the source's input names.
        details = holder["debugger"]._quant_interpreter.get_input_details()
        order = [_match_input(str(d["name"]), [s.name for s in source.inputs]) for d in details]
        dtypes = {s.name: s.dtype for s in source.inputs}
        for feed in samples:
            yield [as_input_dtype(feed[name], dtypes[name]) for name in order]

    try:
        instrumented = tf_convert.mlir_quantize(
            calibrated,
            disable_per_channel=not request.recipe.per_channel,
            fully_quantize=False,
            enable_numeric_verify=True,
        )
        options = tf.lite.experimental.QuantizationDebugOptions(
            layer_direct_compare_metrics={"channel_error": channel_error}
        )
        debugger = holder["debugger"] = tf.lite.experimental.QuantizationDebugger(
            quant_debug_model_content=bytes(instrumented), debug_dataset=debug_dataset, debug_options=options
        )
        debugger.run()
        buffer = io.StringIO()
        debugger.layer_statistics_dump(buffer)
    except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(f"The TFLite quantization debugger failed: {_key_line(exc)}") from None
    rows = list(csv.DictReader(io.StringIO(buffer.getvalue())))
    names = [row.get("tensor_name", "") for row in rows]  # the dump follows ``layer_statistics`` order
    channel: dict[str, float] = {}
    if names and len(calls) == len(names) * len(samples):
        merged = {name: ChannelError(axis=-1) for name in names}
        for index, stats in enumerate(calls):
            target = merged[names[index % len(names)]]
            if stats.signal is None or stats.noise is None:
                target.bad_shape = True
            elif target.signal is None or target.noise is None:
                target.signal, target.noise, target.samples = stats.signal, stats.noise, 1
            elif target.signal.shape == stats.signal.shape:
                target.signal, target.noise = target.signal + stats.signal, target.noise + stats.noise
            else:
                target.bad_shape = True
        channel = {name: stats.score() for name, stats in merged.items()}
    steps: dict[str, float] = {}
    for row in rows:
        try:
            mse = float(row["mean_squared_error"])
            scale = float(row["scale"])
        except (KeyError, ValueError):
            continue
        score = math.sqrt(max(mse, 0.0)) / scale if scale > 0 else float("inf")
        steps[row["tensor_name"]] = float("inf") if math.isnan(score) else score
    return calibrated, channel, steps


def _ranked(scores: dict[str, float]) -> list[tuple[str, float]]:
    rows = [(name, score) for name, score in scores.items() if not math.isnan(score)]
    rows.sort(key=lambda item: item[1], reverse=True)
    return rows


def layer_errors(request: ConversionRequest, *, limit: int) -> list[tuple[str, float]]:
    """Per-layer int8 quantization error, worst first: (op output tensor name, per-channel relative error).

    Each op's quantized output against its float copy fed the same input (the TFLite quantization
    debugger), as RMS error over RMS value of each output channel, the median over the channels that carry
    signal (``sensitivity.ChannelError``): ~1 means the layer's output is lost, a few percent is normal. The
    debugger's own RMSE / scale hides exactly the layers that hurt most (an outlier sets the scale), so it is
    not used to rank. The names are accepted by ``nodes_to_exclude``.
    """
    _model, channel, steps = _debug_run(request)
    return _ranked(channel or steps)[:limit]


def _op_graph(model: bytes) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """(builtin op name, first output tensor name) of each op of the main graph, and which ops read each
    op's outputs (op name -> consumer op names, by first output tensor name)."""
    from toolkit.runtimes.inspection.tflite import _schema

    schema = _schema()
    parsed = schema.ModelT.InitFromPackedBuf(model, 0)
    codes = parsed.operatorCodes or []
    op_names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    graph = parsed.subgraphs[0]
    tensors = graph.tensors or []
    ops: list[tuple[str, str]] = []
    producer: dict[int, str] = {}
    readers: list[tuple[str, list[int]]] = []
    for op in graph.operators or []:
        code = codes[op.opcodeIndex]
        kind = str(op_names.get(max(int(code.builtinCode), int(code.deprecatedBuiltinCode)), "CUSTOM"))
        outs = [int(i) for i in (op.outputs if op.outputs is not None else []) if int(i) >= 0]
        if not outs:
            continue
        raw = tensors[outs[0]].name
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        ops.append((kind, name))
        for index in outs:
            producer[index] = name
        readers.append((name, [int(i) for i in (op.inputs if op.inputs is not None else []) if int(i) >= 0]))
    consumers: dict[str, list[str]] = {}
    for name, inputs in readers:
        for index in inputs:
            source = producer.get(index)
            if source is not None and name not in consumers.setdefault(source, []):
                consumers[source].append(name)
    return ops, consumers


# Ops that move or select values without computing new ones: a tensor passes through them unchanged in
# scale, so the compute op behind them is the one that would re-quantize it.
_PASSTHROUGH = {
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "MAX_POOL_2D", "CONCATENATION", "PAD", "PADV2",
    "STRIDED_SLICE", "SLICE", "GATHER", "SPLIT", "SPLIT_V", "PACK", "UNPACK", "RELU", "RELU6", "DEPTH_TO_SPACE",
    "SPACE_TO_DEPTH", "RESIZE_NEAREST_NEIGHBOR",
}


def float_groups(request: ConversionRequest, *, limit: int) -> list[tuple[tuple[str, ...], float]]:
    """The groups of ops worth keeping in float, best first: (op output tensor names, output error).

    Shortlists ``sensitivity.MAX_CULPRITS`` ops by per-channel error and by error in steps, then builds each
    one alone and with its consumers in float (``sensitivity.float_group``) from one calibration, runs them on
    ``sensitivity.SENSITIVITY_SAMPLES`` calibration samples and orders them by the relative error of the
    outputs against the source model (0 = as good as float). The names go straight into ``nodes_to_exclude``.
    """
    from tensorflow.lite.python import convert as tf_convert

    from toolkit.conversion import sensitivity
    from toolkit.runtimes.execution.tflite import TFLiteSession

    calibrated, channel, steps = _debug_run(request)
    ops, consumers = _op_graph(calibrated)
    kinds = {name: kind for kind, name in ops}

    def op_of(tensor: str) -> str | None:
        if tensor in kinds:
            return tensor
        prefixed = [n for n in kinds if tensor.startswith(n) and tensor[len(n) :].isdigit()]
        return max(prefixed, key=len) if prefixed else None

    def named(ranking: list[tuple[str, float]]) -> list[tuple[str, float]]:
        return [(op, score) for name, score in ranking if (op := op_of(name)) is not None]

    culprits = sensitivity.shortlist(named(_ranked(channel)), named(_ranked(steps)))
    groups = {
        name: sensitivity.float_group(name, consumers, lambda op: kinds.get(op) in _PASSTHROUGH)
        for name in culprits
    }
    source = _source(request)
    samples = list(request.calibration[: sensitivity.SENSITIVITY_SAMPLES])
    feeds = [{s.name: as_input_dtype(feed[s.name], s.dtype) for s in source.inputs} for feed in samples]
    reference = [[np.asarray(o) for o in source.predict(feed)] for feed in feeds]
    measured: dict[tuple[str, ...], float] = {}
    for group in sensitivity.candidates(culprits, groups):
        try:
            model = tf_convert.mlir_quantize(
                calibrated,
                disable_per_channel=not request.recipe.per_channel,
                fully_quantize=False,
                denylisted_nodes=list(group),
            )
        except Exception:  # noqa: BLE001, S112 (a group the quantizer cannot split is simply not a candidate)
            continue
        fd, name = tempfile.mkstemp(suffix=".tflite", dir=request.workdir)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(bytes(model))
            session = TFLiteSession(Path(name))
            try:
                outputs = [[np.asarray(o) for o in session.run(feed)] for feed in feeds]
            finally:
                session.close()
        except Exception:  # noqa: BLE001, S112 (a candidate that does not run is not a candidate)
            continue
        finally:
            os.unlink(name)
        measured[group] = sensitivity.output_error(reference, outputs)
    return sensitivity.order(measured, limit=limit)


def _match_input(tensor_name: str, names: Sequence[str]) -> str:
    """``serving_default_image:0`` -> ``image`` (the longest source input name it contains)."""
    base = tensor_name.split(":")[0]
    for name in sorted(names, key=len, reverse=True):
        if base == name or base.endswith(f"_{name}"):
            return name
    if len(names) == 1:
        return names[0]
    raise ConversionError(f"Cannot tell which input the TFLite tensor {tensor_name!r} is.")
