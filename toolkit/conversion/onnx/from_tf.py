"""Keras / SavedModel -> float ONNX through tf2onnx 1.17 (``onnx.quant`` derives the precisions).

tf2onnx's ``from_keras`` raises ``KeyError: 'keras_tensor_5'`` on Keras 3 Sequential models (findings.md), so
every source goes through ``from_function`` on its serving function (shapes pinned, or the batch dynamic with
``request.dynamic_batch``), then the fixed-shape SavedModel export if that fails. Graph inputs and outputs get
the source's names so the pipeline can feed by name. ``Any``: tf2onnx and TensorFlow objects (untyped).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.conversion.onnx.graph_io import export_opset, require_onnx, staged_file
from toolkit.errors import ConversionError, MissingDependency, UsageError, key_line

if TYPE_CHECKING:  # pragma: no cover
    from onnx import ModelProto

DEFAULT_OPSET = 17


def _shapes(request: ConversionRequest) -> dict[str, tuple[int | None, ...]]:
    source = request.source
    shapes: dict[str, tuple[int | None, ...]] = {}
    for spec in source.inputs:
        shape: tuple[int | None, ...] = tuple(request.input_shapes.get(spec.name, spec.shape))
        if request.dynamic_batch and shape:
            shape = (None, *shape[1:])
        if any(d is None for d in shape[1 if request.dynamic_batch else 0 :]):
            raise UsageError(
                f"Input {spec.name!r} has dynamic dimensions {shape}; the ONNX export needs them fixed.",
                hint=f"Give --input-shape {spec.name}=D0,D1,... or calibration data that fixes them.",
            )
        shapes[spec.name] = shape
    return shapes


def require_tf2onnx(purpose: str) -> ModuleType:
    """The ``tf2onnx`` module, or the error naming the extra that brings it."""
    try:
        import tf2onnx
    except ImportError as exc:
        raise MissingDependency("tf2onnx", extra="tf", purpose=purpose) from exc
    return tf2onnx


def check_written(proto: ModelProto) -> None:
    """onnx's checker on what tf2onnx wrote; a model it refuses is a ConversionError (one plain line)."""
    try:
        require_onnx().checker.check_model(proto)
    except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise ConversionError(f"tf2onnx wrote an invalid ONNX model: {key_line(exc)}") from None


def rename_io(model: ModelProto, inputs: list[str], outputs: list[str]) -> None:
    """Give graph inputs/outputs the source's names (tf2onnx appends ``:0`` or keeps ``Identity`` names)."""
    renames: dict[str, str] = {}
    for values, names in ((model.graph.input, inputs), (model.graph.output, outputs)):
        if {v.name for v in values} == set(names):
            continue  # already the source's names, maybe in another order (tf2onnx sorts a dict's keys)
        for value, name in zip(values, names):
            if value.name != name:
                renames[value.name] = name
    if not renames:
        return
    taken = {v.name for v in model.graph.value_info} | {n for node in model.graph.node for n in node.output}
    clashes = [new for old, new in renames.items() if new in taken and new not in renames]
    if clashes:
        return  # keep tf2onnx's names rather than produce an ambiguous graph
    for value in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        if value.name in renames:
            value.name = renames[value.name]
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for i, name in enumerate(node.output):
            if name in renames:
                node.output[i] = renames[name]


def _bind_captured_constants(proto: ModelProto, function: Any, inputs: list[str]) -> list[str]:
    """Graph inputs that are really constants captured by the traced function become initializers: tf2onnx turns
    what a ``tf.function`` captures by value (Keras' ``Normalization`` mean and variance, as in
    ``keras.applications.EfficientNetB0``) into graph inputs the device would have to feed. Returns the names folded."""
    from onnx import numpy_helper

    try:
        captures = function.get_concrete_function().graph.captures
    except Exception:  # noqa: BLE001 - no concrete function to read: nothing to fold
        return []
    values = {}
    for external, internal in captures:
        if getattr(external, "dtype", None) is not None and external.dtype.name != "resource" and hasattr(
            external, "numpy"
        ):
            values[internal.name] = external.numpy()
    bound = []
    keep = []
    for value_info in proto.graph.input:
        name = value_info.name
        if name not in inputs and name in values:
            proto.graph.initializer.append(numpy_helper.from_array(np.asarray(values[name]), name))
            bound.append(name)
        else:
            keep.append(value_info)
    if bound:
        del proto.graph.input[:]
        proto.graph.input.extend(keep)
    return bound


def export(request: ConversionRequest, output: Path) -> BuiltArtifact:
    """Write the fp32 ONNX model of a Keras/SavedModel source to ``output`` (opset 17 or ``max_opset``)."""
    from toolkit.sources.tensorflow import TensorFlowSource

    source = request.source
    if not isinstance(source, TensorFlowSource):
        raise UsageError(f"The tf2onnx route exports Keras and SavedModel sources, not {source.framework}.")
    tf2onnx = require_tf2onnx("Exporting a TensorFlow model to ONNX")
    opset = export_opset(request, DEFAULT_OPSET)
    shapes = _shapes(request)
    in_names = [s.name for s in source.inputs]
    out_names = [s.name for s in source.outputs]
    errors: list[str] = []
    proto = None
    exporter = ""
    attempts: list[tuple[str, Callable[[], Any]]] = [("from_function", lambda: source.serving_function(shapes))]
    if not request.dynamic_batch:
        attempts.append(("SavedModel export + from_function", lambda: _saved_model_function(request, shapes)))
    for label, make in attempts:
        try:
            function = make()
            proto, _ = tf2onnx.convert.from_function(
                function, input_signature=function.input_signature, opset=opset
            )
            exporter = f"tf2onnx {tf2onnx.__version__} ({label})"
            break
        except (UsageError, ConversionError):
            raise
        except Exception as exc:  # tf2onnx raises anything from KeyError to ValueError  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
            errors.append(f"{label}: {key_line(exc)}")
    if proto is None:
        raise ConversionError(
            "tf2onnx could not export the model to ONNX: " + "; ".join(errors),
            hint="The model may use TensorFlow ops without an ONNX mapping at this opset; try a higher opset "
            "(a target that allows it) or the TFLite format.",
        )
    bound = _bind_captured_constants(proto, function, in_names)
    rename_io(proto, in_names, out_names)
    if request.dynamic_batch:
        for value in list(proto.graph.input) + list(proto.graph.output):
            dims = value.type.tensor_type.shape.dim
            if dims and not dims[0].HasField("dim_value"):
                dims[0].dim_param = "batch"
    check_written(proto)
    with staged_file(output) as tmp:
        require_onnx().save_model(proto, str(tmp))
    notes = (f"opset {opset}",) + (("dynamic batch",) if request.dynamic_batch else ()) + (
        (f"{len(bound)} constant(s) that tf2onnx left as graph inputs folded into the model: "
         f"{', '.join(bound[:4])}",) if bound else ())
    return BuiltArtifact(path=output, exporter=exporter, notes=notes)


def _saved_model_function(request: ConversionRequest, shapes: dict[str, tuple[int | None, ...]]) -> Any:
    """The fixed-shape SavedModel export's serving signature, wrapped as a tf.function for tf2onnx."""
    import tensorflow as tf

    from toolkit.conversion.tflite.convert import fixed_saved_model

    loaded = tf.saved_model.load(str(fixed_saved_model(request)))
    signature = loaded.signatures["serving_default"]
    names = [s.name for s in request.source.inputs]
    specs = [
        tf.TensorSpec(shapes[n], tf.as_dtype(s.dtype), name=n) for n, s in zip(names, request.source.inputs)
    ]

    def serve(*args: Any) -> Any:
        return signature(**dict(zip(names, args)))

    function = tf.function(serve, input_signature=specs, autograph=False)
    function.edgetk_keepalive = loaded  # the variables must outlive the trace
    return function
