"""Keras / SavedModel -> TFLite: fp32, fp16, dynamic range, and full int8 from calibration data.

Route (findings.md): the source is exported once to a SavedModel with the requested input shapes pinned
(``keras.export.ExportArchive`` for Keras 3, which freezes the variables correctly) and converted with
``TFLiteConverter.from_saved_model``. ``from_concrete_functions`` on a live Keras 3 model yields NaN models;
every artifact therefore passes a sanity run (``sanity_check``) on one calibration sample before it is
written, and a non-finite output stops the conversion with a :class:`ConversionError`.

Full int8 takes ``request.recipe.io_dtype`` (int8 by default, uint8, or float32 I/O). Selective
quantization (``recipe.nodes_to_exclude``) goes through the MLIR quantizer the TFLite quantization debugger
uses: the model is calibrated once, then quantized with those nodes (op output tensor names, Keras layer
names, or builtin op names such as ``FULLY_CONNECTED``) denylisted, so they stay float.
``layer_errors`` ranks layers by their quantization error (the debugger's per-layer RMSE / scale) so the
pipeline can pick which to keep in float.

Nothing is ever left half-written at ``output``: the model is written to a temporary file next to it and
renamed only after the sanity run passed.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.errors import ConversionError, UsageError

_IO_TYPES = {"int8": "int8", "uint8": "uint8", "float32": "float32"}


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
            yield {s.name: np.asarray(feed[s.name], dtype=np.float32) for s in source.inputs}

    return generate


def _require_calibration(request: ConversionRequest) -> None:
    if not request.calibration:
        raise UsageError(
            "Full int8 TFLite conversion needs calibration data.",
            hint="Pass --calibration PATH (.npy/.npz/image folder), or ask for --precision dynamic.",
        )


def _converter(request: ConversionRequest, *, int8_ops_only: bool = True) -> Any:
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
        if int8_ops_only:
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            if recipe.io_dtype != "float32":
                converter.inference_input_type = tf.as_dtype(_IO_TYPES[recipe.io_dtype])
                converter.inference_output_type = tf.as_dtype(_IO_TYPES[recipe.io_dtype])
        if not recipe.per_channel:
            converter._experimental_disable_per_channel = True
    return converter


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
    from toolkit.inspection.tflite import parse_tflite

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


def _selective_int8(request: ConversionRequest) -> tuple[bytes, list[str]]:
    """Calibrate once, then quantize with the requested nodes denylisted (kept float)."""
    tf = _tf()
    from tensorflow.lite.python import convert as tf_convert  # the quantizer the debugger uses
    from tensorflow.lite.python import util as tf_util

    recipe = request.recipe
    converter = _converter(request, int8_ops_only=False)
    converter.experimental_mlir_quantizer = True
    converter._experimental_calibrate_only = True
    calibrated = _run(converter, "int8 calibration")
    model_obj = getattr(request.source, "model", None)
    layers = [str(layer.name) for layer in getattr(model_obj, "layers", [])]
    nodes, types = resolve_nodes(recipe.nodes_to_exclude, _op_outputs(calibrated, request.workdir), layers)
    try:
        model = tf_convert.mlir_quantize(
            calibrated,
            disable_per_channel=not recipe.per_channel,
            fully_quantize=False,
            denylisted_nodes=nodes or None,
            denylisted_ops=types or None,
        )
        if recipe.io_dtype != "float32":
            io_type = tf.as_dtype(_IO_TYPES[recipe.io_dtype])
            model = tf_util.modify_model_io_type(model, io_type, io_type)
    except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(
            f"Selective int8 quantization failed: {_key_line(exc)}",
            hint="An input or output next to a float node cannot take integer I/O; use io_dtype float32 or "
            "keep fewer nodes in float.",
        ) from None
    return bytes(model), nodes + types


# --------------------------------------------------------------------------------------------- checks


def sanity_check(path: Path, request: ConversionRequest) -> None:
    """Run the artifact once (first calibration sample, or zeros) and refuse non-finite outputs.

    This is what catches the silent NaN models that some converter entry points produce (uninitialised
    variables), before such a file is ever written where the pipeline would ship it.
    """
    from toolkit.execution.tflite import TFLiteSession

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
                np.asarray(sample, dtype=np.float32) if sample is not None else np.zeros(shape, np.float32)
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


def _check_int8(path: Path) -> None:
    from toolkit.inspection.tflite import inspect_tflite

    info = inspect_tflite(path)
    if info.quantized_ops == 0:
        raise ConversionError(
            "int8 quantization changed nothing: the converted model has no operator computing in integer.",
            hint="The model's ops may have no int8 kernels; use fp16 or dynamic instead.",
        )


# --------------------------------------------------------------------------------------------- route


def convert(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """Build ``request.recipe`` (format tflite) at ``output``; never leaves a partial file there."""
    recipe = request.recipe
    if recipe.format != "tflite":
        raise UsageError(f"The TFLite route cannot build {recipe.format} artifacts.")
    notes: list[str] = []
    float_nodes: tuple[str, ...] = ()
    if recipe.precision == "int8" and recipe.nodes_to_exclude:
        _require_calibration(request)
        model, resolved = _selective_int8(request)
        float_nodes = tuple(recipe.nodes_to_exclude)
        notes.append(f"kept in float: {', '.join(resolved)}")
    else:
        model = _run(_converter(request), recipe.precision)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(model)
        # LiteRT picks the format from the content, but TFLiteSession wants the real model file.
        sanity_check(tmp, request)
        if recipe.precision == "int8":
            _check_int8(tmp)
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    exporter = "TFLiteConverter.from_saved_model (keras.export.ExportArchive)"
    if float_nodes:
        exporter = "TFLiteConverter calibration + MLIR quantizer with denylisted nodes"
    return BuiltArtifact(path=output, float_nodes=float_nodes, notes=tuple(notes), exporter=exporter)


def layer_errors(request: ConversionRequest, *, limit: int) -> list[tuple[str, float]]:
    """Per-layer int8 quantization error, worst first: (op output tensor name, RMSE / scale).

    RMSE between the float and quantized outputs of each layer (fed the same quantized input), divided by
    the layer's output scale, i.e. the error in quantization steps: above about 0.3-0.5 a layer loses
    information and is a candidate for ``nodes_to_exclude``. The names are accepted by ``nodes_to_exclude``.
    """
    tf = _tf()
    _require_calibration(request)
    converter = tf.lite.TFLiteConverter.from_saved_model(str(fixed_saved_model(request)))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = _representative(request)
    if not request.recipe.per_channel:
        converter._experimental_disable_per_channel = True
    source = _source(request)
    samples = list(request.calibration[:32])
    holder: dict[str, Any] = {}

    def debug_dataset() -> Iterator[list[np.ndarray]]:
        # The debugger feeds lists in its interpreter's input order (tensor names such as
        # ``serving_default_image:0``); map them back to the source's input names.
        details = holder["debugger"]._quant_interpreter.get_input_details()
        order = [_match_input(str(d["name"]), [s.name for s in source.inputs]) for d in details]
        for feed in samples:
            yield [np.asarray(feed[name], dtype=np.float32) for name in order]

    try:
        debugger = holder["debugger"] = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=debug_dataset
        )
        debugger.run()
        buffer = io.StringIO()
        debugger.layer_statistics_dump(buffer)
    except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(f"The TFLite quantization debugger failed: {_key_line(exc)}") from None
    rows = list(csv.DictReader(io.StringIO(buffer.getvalue())))
    scores: list[tuple[str, float]] = []
    for row in rows:
        try:
            mse = float(row["mean_squared_error"])
            scale = float(row["scale"])
        except (KeyError, ValueError):
            continue
        score = math.sqrt(max(mse, 0.0)) / scale if scale > 0 else float("inf")
        if math.isnan(score):
            score = float("inf")
        scores.append((row["tensor_name"], score))
    scores.sort(key=lambda item: item[1], reverse=True)
    return scores[:limit]


def _match_input(tensor_name: str, names: Sequence[str]) -> str:
    """``serving_default_image:0`` -> ``image`` (the longest source input name it contains)."""
    base = tensor_name.split(":")[0]
    for name in sorted(names, key=len, reverse=True):
        if base == name or base.endswith(f"_{name}"):
            return name
    if len(names) == 1:
        return names[0]
    raise ConversionError(f"Cannot tell which input the TFLite tensor {tensor_name!r} is.")
