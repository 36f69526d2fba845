"""Keras / SavedModel -> TFLite: fp32, fp16, dynamic range, full int8 (I/O ``recipe.io_dtype``) and A16W8.

The source is exported once to a SavedModel with the input shapes pinned (``keras.export.ExportArchive`` for
Keras 3, which freezes the variables correctly) and converted with ``TFLiteConverter.from_saved_model``:
``from_concrete_functions`` on a live Keras 3 model yields NaN models (findings.md), so every artifact passes
``sanity_check`` before it is renamed into place at ``output`` (never left half-written). A run calibrates
once (``calibrated_model``); full int8, the fragile-pattern pass and selective rebuilds (``nodes_to_exclude``
denylisted in the MLIR quantizer the debugger uses) quantize that one calibrated model. A16W8 is the
converter's own 16x8 build with float I/O: it calibrates for itself (``_a16w8``). Which entries name which ops:
``tflite.nodes``; integer I/O around float islands: ``tflite.borders``; the layer table: ``tflite.debugger``.
``Any``: TensorFlow objects (tensorflow is imported lazily and untyped).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.compat import tensorflow as tf_compat
from toolkit.conversion import fragile
from toolkit.conversion.tflite import fragile as fragile_tflite
from toolkit.conversion.base import BuiltArtifact, ConversionRequest, as_input_dtype
from toolkit.conversion.tflite.borders import int8_borders
from toolkit.conversion.tflite.checks import check_int8, unasked_float
from toolkit.conversion.tflite.nodes import op_outputs, resolve_nodes
from toolkit.errors import ConversionError, UsageError, key_line
from toolkit.model.artifact import FloatIO
from toolkit.model.vocabulary import FloatIOReason, Format, IoDtype, Precision

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.sources.tensorflow import TensorFlowSource


def import_tf() -> ModuleType:
    """TensorFlow, imported with its C++ log quiet."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    return tf


def tf_source(request: ConversionRequest) -> TensorFlowSource:
    """The request's Keras / SavedModel source; another framework's is refused in plain words."""
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
    source = tf_source(request)
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


def _representative(request: ConversionRequest) -> Callable[[], Iterator[dict[str, np.ndarray]]]:
    """The converter's representative dataset: every calibration sample in the source's input dtypes."""
    source = tf_source(request)

    def generate() -> Iterator[dict[str, np.ndarray]]:
        for feed in request.calibration:
            yield {s.name: as_input_dtype(feed[s.name], s.dtype) for s in source.inputs}

    return generate


def _require_calibration(request: ConversionRequest) -> None:
    if not request.calibration:
        raise UsageError(
            "Full int8 TFLite conversion needs calibration data.",
            hint="Pass --calibration PATH (.npy/.npz/image folder), or ask for --precision dynamic.",
        )


def _converter(request: ConversionRequest) -> Any:
    """The converter of ``request.recipe``; for int8 it calibrates (``calibrated_model``), the quantizer runs
    apart."""
    tf = import_tf()
    recipe = request.recipe
    converter = tf.lite.TFLiteConverter.from_saved_model(str(fixed_saved_model(request)))
    if recipe.precision == Precision.FP16:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif recipe.precision == Precision.DYNAMIC:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif recipe.precision == Precision.INT8:
        _require_calibration(request)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _representative(request)
        if not recipe.per_channel:
            tf_compat.per_tensor_weights(converter)
    return converter


@dataclasses.dataclass(frozen=True)
class _Calibration:
    """One calibration of a source on one calibration set: the float model with the recorded tensor ranges."""

    source: object  # compared by identity only
    calibration: Sequence[Mapping[str, np.ndarray]]
    per_channel: bool
    saved_model: str
    model: bytes


_CACHE: list[_Calibration] = []  # the calibrations of this process, newest last
_CACHE_SIZE = 4  # recipes of one run differ in per_channel at most; each entry is a float model's size


def calibrated_model(request: ConversionRequest) -> bytes:
    """The source calibrated on ``request.calibration`` (``_experimental_calibrate_only``), once per run: only the
    source, the calibration samples (the same objects: requests of one run share them), per-channel and the pinned
    shapes decide it, not the recipe's float nodes or I/O types."""
    _require_calibration(request)
    saved_model = str(fixed_saved_model(request))
    per_channel = bool(request.recipe.per_channel)
    for entry in _CACHE:
        if (entry.source is request.source and entry.calibration is request.calibration
                and entry.per_channel == per_channel and entry.saved_model == saved_model):
            return entry.model
    converter = _converter(request)
    converter.experimental_mlir_quantizer = True  # what the debugger sets for its calibration
    tf_compat.calibrate_only(converter)
    model = _run(converter, "int8 calibration")
    _CACHE[:] = [*_CACHE[-(_CACHE_SIZE - 1):], _Calibration(request.source, request.calibration, per_channel,
                                                           saved_model, model)]
    return model


def _full_int8(request: ConversionRequest, calibrated: bytes) -> bytes:
    """Full INT8 from the run's calibration with the recipe's I/O type: what ``TFLiteConverter.convert()`` does
    after calibrating (lite.py ``_quantize``: ``mlir_quantize`` with the I/O types, then the read-only buffers
    deduplicated), so the artifact is the one the converter builds, without calibrating again."""
    tf = import_tf()
    from tensorflow.lite.python import convert as tf_convert
    from tensorflow.lite.python.lite import _deduplicate_readonly_buffers

    recipe = request.recipe
    io_type = tf.as_dtype(str(recipe.io_dtype))
    try:
        model = tf_convert.mlir_quantize(calibrated, disable_per_channel=not recipe.per_channel,
                                         input_data_type=io_type, output_data_type=io_type)
        return bytes(_deduplicate_readonly_buffers(bytes(model)))
    except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(
            f"TFLiteConverter failed (int8): {key_line(exc)}",
            hint="The model may use ops TFLite cannot express in int8; try another precision, or keep the "
            "failing layers in float with nodes_to_exclude.",
        ) from None


def _a16w8(request: ConversionRequest) -> bytes:
    """16-bit activations, 8-bit weights, float I/O: the converter's 16x8 ops set (reference kernels, no XNNPACK). No
    builtin falls back to float (no ``TFLITE_BUILTINS`` beside it): an op without a 16x8 kernel fails the build."""
    tf = import_tf()
    converter = _converter(request)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    return _run(converter, "A16W8")


def _run(converter: Any, what: str) -> bytes:
    try:
        return bytes(converter.convert())
    except Exception as exc:  # the converter raises ConverterError, ValueError, RuntimeError...  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(
            f"TFLiteConverter failed ({what}): {key_line(exc)}",
            hint="The model may use ops TFLite cannot express in this precision; try another precision, or "
            "keep the failing layers in float with nodes_to_exclude.",
        ) from None


# --------------------------------------------------------------------------------------------- selective


def _selective_int8(
    request: ConversionRequest, *, only_if_fragile: bool = False
) -> tuple[bytes, list[str], tuple[FloatIO, ...], list[tuple[str, str]]] | None:
    """Quantize the run's calibration with the requested and the known-fragile nodes denylisted; integer I/O stays
    integer (``int8_borders``) except an output a mixed-range Concat writes. Returns (model, denylisted names, I/O
    left float with why, fragile (node, why)); None when ``only_if_fragile`` and nothing fragile was found."""
    tf = import_tf()
    from tensorflow.lite.python import convert as tf_convert  # the quantizer the debugger uses
    from tensorflow.lite.python import util as tf_util

    recipe = request.recipe
    calibrated = calibrated_model(request)
    found, float_outputs = fragile_tflite.tflite_fragile_nodes(calibrated)
    if only_if_fragile and not found:
        return None
    model_obj = getattr(request.source, "model", None)
    layers = [str(layer.name) for layer in getattr(model_obj, "layers", [])]
    nodes, types = resolve_nodes(recipe.nodes_to_exclude, op_outputs(calibrated, request.workdir), layers=layers)
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
        if recipe.io_dtype != IoDtype.FLOAT32:
            model, stays = int8_borders(bytes(model), calibrated, keep_float=keep_float_io)
            io_type = tf.as_dtype(str(recipe.io_dtype))
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
            f"Selective int8 quantization failed: {key_line(exc)}",
            hint="Keep fewer nodes in float, or use io_dtype float32.",
        ) from None
    return bytes(model), nodes + types, stays, found


def _reads_integer_input(model: bytes) -> bool:
    """Whether the model has an integer input (token ids): the integer-input rule's candidates (its switch)."""
    return bool(fragile_tflite.tflite_graph(model).integer)


def _has_output_concat(model: bytes) -> bool:
    """Whether a Concat reaches a graph output through pass-through ops only (the fragile rule's candidates):
    the cheap structural test that decides whether a calibration is spent on measuring its input ranges."""
    ops, outputs = fragile_tflite.tflite_graph(model)[:2]
    writes = {out: (kind, ins) for kind, ins, outs in ops for out in outs}
    for name in outputs:
        current = name
        while current in writes:
            kind, ins = writes[current]
            if kind == "CONCATENATION":
                return True
            if kind not in fragile_tflite.TFLITE_PASSTHROUGH and kind not in ("QUANTIZE", "DEQUANTIZE") or not ins:
                break
            current = ins[0]
    return False


# --------------------------------------------------------------------------------------------- checks


def sanity_check(path: Path, request: ConversionRequest) -> None:
    """Run the artifact once (first calibration sample, or zeros) and refuse non-finite outputs: the silent NaN
    models some converter entry points produce (uninitialised variables) are caught before they are written."""
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
            raise ConversionError(f"The converted model fails to run in LiteRT: {key_line(exc)}") from None
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


# --------------------------------------------------------------------------------------------- route


def convert(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """Build ``request.recipe`` (format tflite) at ``output``; never leaves a partial file there."""
    recipe = request.recipe
    if recipe.format != Format.TFLITE:
        raise UsageError(f"The TFLite route cannot build {recipe.format} artifacts.")
    notes: list[str] = []
    float_nodes: tuple[str, ...] = ()
    float_io: tuple[FloatIO, ...] = ()
    selective = None
    if recipe.a16w8 and recipe.nodes_to_exclude:
        raise UsageError("A16W8 TFLite keeps no layers in float: the 16x8 converter takes no denylist.",
                         hint="Leave nodes_to_exclude empty for the A16W8 recipe.")
    if recipe.precision == Precision.INT8 and recipe.nodes_to_exclude:
        _require_calibration(request)
        selective = _selective_int8(request)
    elif recipe.a16w8:
        model = _a16w8(request)
    elif recipe.precision == Precision.INT8:
        model = _full_int8(request, calibrated_model(request))
        if _has_output_concat(model) or _reads_integer_input(model) or fragile_tflite.tflite_has_decomposition(model):
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
            notes += unasked_float(tmp, resolved)
        if recipe.precision == Precision.INT8:
            check_int8(tmp, io_dtype=recipe.io_dtype if float_nodes else IoDtype.FLOAT32, float_io=float_io)
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    exporter = "TFLiteConverter.from_saved_model (keras.export.ExportArchive)"
    if float_nodes:
        exporter = "TFLiteConverter calibration + MLIR quantizer with denylisted nodes"
    elif recipe.a16w8:
        exporter += ", 16x8 calibrate-and-quantize (int16 activations, int8 weights)"
    elif recipe.precision == Precision.INT8:
        exporter += ", calibration + MLIR quantizer"
    return BuiltArtifact(path=output, float_nodes=float_nodes, notes=tuple(notes), exporter=exporter,
                         float_io=float_io)
