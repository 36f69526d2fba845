"""Read from an artifact how much of it computes in integer (``toolkit.model.quantized.QuantizedShare``).

Per weighted layer (convolution, matmul, recurrent cell, embedding) of every subgraph: its weights (the
constant operands of rank >= 2, read directly or through a DEQUANTIZE/DequantizeLinear of a constant), whether
it computes in integer, and its multiply-accumulates (output elements x weights / output channels: exact for
convolutions, depthwise convolutions and matmuls, per step for recurrent cells).

* TFLite: the op computes in integer when an operand is int8/int16 (``inspection.tflite.is_integer_op``:
  full-integer, 16x8 and dynamic-range ops); shapes are in the flatbuffer.
* ONNX: the layer's weight is an integer initializer (QOperator and dynamic ops read it directly; QDQ reads it
  through a DequantizeLinear); output shapes from ONNX shape inference (a dimension it cannot fix counts 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.model.quantized import LARGE_LAYER, LEFT_FLOAT, NESTED, FloatLayer, QuantizedShare, names_layer
from toolkit.model.vocabulary import Precision

if TYPE_CHECKING:  # pragma: no cover
    from onnx import ModelProto, TensorProto

TFLITE_WEIGHTED = frozenset({
    "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL", "TRANSPOSE_CONV", "CONV_3D",
    "UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM", "UNIDIRECTIONAL_SEQUENCE_RNN", "LSTM", "SVDF",
    "EMBEDDING_LOOKUP", "GATHER",
})
ONNX_WEIGHTED = frozenset({
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Gather", "FusedConv", "FusedMatMul",
    "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QGemm", "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat", "DynamicQuantizeLSTM", "Attention", "QAttention",
})
_LOOKUPS = frozenset({"EMBEDDING_LOOKUP", "GATHER", "Gather"})  # weights, no multiply-accumulates
_CHANNELS_FIRST = frozenset({"Conv", "ConvTranspose", "QLinearConv", "ConvInteger", "FusedConv"})
_RECURRENT = frozenset({"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"})
_INTEGER = frozenset({"int8", "uint8", "int16", "uint16", "int4", "uint4"})


@dataclass(frozen=True)
class Layer:
    name: str
    op: str
    params: int  # weight elements
    bytes: int
    macs: int
    integer: bool
    nested: bool = False  # ONNX: inside an If/Loop/Scan body


def share_of(layers: Sequence[Layer], why: Callable[[str], str] = lambda name: LEFT_FLOAT,
             ) -> QuantizedShare | None:
    """The shares over ``layers``; None when the model has no weighted layer."""
    params = sum(layer.params for layer in layers)
    if not params:
        return None
    macs = sum(layer.macs for layer in layers)
    quantized = [layer for layer in layers if layer.integer]
    floats = sorted((layer for layer in layers if not layer.integer), key=lambda layer: -layer.params)

    def reason(layer: Layer) -> str:
        said = why(layer.name)
        return f"{said}: it sits {NESTED}" if layer.nested and said == LEFT_FLOAT else said

    large = tuple(FloatLayer(layer.name, layer.op, layer.params / params, layer.macs / macs if macs else 0.0,
                             reason(layer))
                  for layer in floats
                  if layer.params / params >= LARGE_LAYER or (macs and layer.macs / macs >= LARGE_LAYER))
    return QuantizedShare(
        weights=sum(layer.params for layer in quantized) / params,
        macs=sum(layer.macs for layer in quantized) / macs if macs else math.nan,
        quantized_bytes=sum(layer.bytes for layer in quantized),
        float_bytes=sum(layer.bytes for layer in floats),
        float_layers=large[:8],
    )


def _macs(op: str, out_shape: Sequence[int] | None, params: int, *, channels_first: bool) -> int:
    if op in _LOOKUPS:
        return 0
    if not out_shape:
        return params  # no shape known: each weight used once
    elements = math.prod(max(1, d) for d in out_shape)
    if op in _RECURRENT and len(out_shape) >= 3:  # ONNX Y [T, D, B, H] / Y_h [D, B, H]
        channels = out_shape[-1] * (out_shape[1] if len(out_shape) == 4 else out_shape[0])
    else:
        channels = out_shape[1] if channels_first and len(out_shape) > 1 else out_shape[-1]
    return int(elements * params / max(1, channels))


# --------------------------------------------------------------------------------------------- TFLite


def _size(buffer: Any) -> int:  # Any: generated schema code
    """Bytes of a flatbuffer buffer: inline data, or the size of data stored after the flatbuffer (> 2 GB)."""
    return len(buffer.data) if buffer.data is not None else int(buffer.size or 0)


def tflite_layers(path: Path) -> list[Layer]:
    from toolkit.runtimes.inspection.tflite import (OpView, flatbuffer_schema, is_integer_op, schema_names,
                                                   schema_text, tensor_dtype)

    schema = flatbuffer_schema()
    model = schema.ModelT.InitFromPackedBuf(Path(path).read_bytes(), 0)
    type_names, op_names = schema_names(schema)
    buffers = model.buffers or []

    def dtype(tensor: Any) -> str:  # Any: generated schema code
        return tensor_dtype(type_names, tensor)

    def _rank(tensor: Any) -> int:  # Any: generated schema code
        return 0 if tensor.shape is None else len(tensor.shape)

    def constant(tensor: Any) -> bool:  # Any: generated schema code
        buffer = buffers[tensor.buffer] if 0 < tensor.buffer < len(buffers) else None
        return buffer is not None and _size(buffer) > 0

    layers = []
    for graph in model.subgraphs or []:
        tensors = graph.tensors or []
        dequantized = {}  # output of a DEQUANTIZE of a constant -> that constant
        for op in graph.operators or []:
            code = model.operatorCodes[op.opcodeIndex]
            name = op_names.get(max(int(code.builtinCode), int(code.deprecatedBuiltinCode)), "")
            ins = [int(i) for i in (op.inputs if op.inputs is not None else []) if int(i) >= 0]
            outs = [int(i) for i in (op.outputs if op.outputs is not None else []) if int(i) >= 0]
            if name == "DEQUANTIZE" and ins and constant(tensors[ins[0]]):
                dequantized[outs[0]] = ins[0]
                continue
            if name not in TFLITE_WEIGHTED or not outs:
                continue
            weights = [dequantized.get(i, i) for i in ins
                       if (i in dequantized or constant(tensors[i])) and _rank(tensors[i]) >= 2]
            if not weights:
                continue
            shapes = [[int(d) for d in tensors[w].shape] for w in weights]
            params = sum(math.prod(s) for s in shapes)
            size = sum(_size(buffers[tensors[w].buffer]) for w in weights)
            view = OpView(name, tuple(dtype(tensors[i]) for i in ins), tuple(dtype(tensors[i]) for i in outs), ())
            out = tensors[outs[0]].shape
            out = None if out is None else [int(d) for d in out]
            layers.append(Layer(schema_text(tensors[outs[0]].name), name, params, size,
                                _macs(name, out, params, channels_first=False), is_integer_op(view)))
    return layers


# --------------------------------------------------------------------------------------------- ONNX


def onnx_layers(path: Path) -> list[Layer]:
    import onnx

    return onnx_model_layers(onnx.load(str(path)))


def onnx_model_layers(model: ModelProto) -> list[Layer]:
    """``onnx_layers`` of a model in memory."""
    import onnx

    from toolkit.runtimes.inspection.onnx import iter_graphs

    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - shapes are only for the MAC estimate
        pass
    inits: dict[str, TensorProto] = {}
    shapes: dict[str, list[int]] = {}
    dequantized: dict[str, str] = {}
    for graph in iter_graphs(model.graph):
        inits.update({t.name: t for t in graph.initializer})
        for vi in [*graph.input, *graph.output, *graph.value_info]:
            if vi.type.tensor_type.HasField("shape"):
                shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]
        for node in graph.node:
            if node.op_type == "DequantizeLinear" and node.input[0] in inits:
                dequantized[node.output[0]] = node.input[0]
            if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
                inits[node.output[0]] = node.attribute[0].t
    layers = []
    for index, graph in enumerate(iter_graphs(model.graph)):  # index 0: the main graph
        for node in graph.node:
            if node.op_type not in ONNX_WEIGHTED:
                continue
            weights = [inits[dequantized.get(i, i)] for i in node.input
                       if dequantized.get(i, i) in inits and len(inits[dequantized.get(i, i)].dims) >= 2]
            if not weights:
                continue
            params = sum(math.prod(w.dims) for w in weights)
            types = {onnx.helper.tensor_dtype_to_np_dtype(w.data_type).name for w in weights}
            integer = any(t in _INTEGER for t in types)
            size = sum(math.prod(w.dims) * onnx.helper.tensor_dtype_to_np_dtype(w.data_type).itemsize for w in weights)
            out = next((shapes.get(o) for o in node.output if o), None)
            layers.append(Layer(node.name or f"<{node.op_type}>", node.op_type, params, size,
                                _macs(node.op_type, out, params, channels_first=node.op_type in _CHANNELS_FIRST), integer,
                                nested=index > 0))
    return layers


def measure(path: Path, why: Callable[[str], str] | None = None) -> QuantizedShare | None:
    """The quantized share of the .tflite or .onnx file at ``path`` (None: no weighted layer)."""
    path = Path(path)
    layers = tflite_layers(path) if path.suffix.lower() == ".tflite" else onnx_layers(path)
    return share_of(layers, why) if why else share_of(layers)


def reasons(float_nodes: Sequence[str], asked: Sequence[str], retried: Mapping[str, str] | None = None,
            ) -> Callable[[str], str]:
    """Why a float layer stayed float, by the names the build kept float: ``retried`` (selective quantization,
    name -> why), ``asked`` (the recipe's nodes_to_exclude: the user's), other ``float_nodes`` (the fragile-op
    rules), else the converter."""

    def named(name: str, nodes: Sequence[str]) -> bool:
        # TFLite fuses op names with ";" and may append an index: any shared part names the same op
        parts = {p for p in name.split(";") if "/" in p}
        return names_layer(name, set(nodes)) or any(parts & set(node.split(";")) for node in nodes)

    def why(name: str) -> str:
        for node, reason in (retried or {}).items():
            if named(name, (node,)):
                return reason
        if named(name, asked):
            return "kept float as asked (nodes_to_exclude)"
        if named(name, float_nodes):
            return "kept float up front (fragile-op rule)"
        return LEFT_FLOAT

    return why


def artifact_share(path: Path, precision: str, float_nodes: Sequence[str], asked: Sequence[str],
                   retried: Mapping[str, str] | None = None) -> QuantizedShare | None:
    """The share recorded for a built int8/dynamic artifact (None for other precisions, or when the file
    cannot be read: the figure is never worth the artifact)."""
    if precision not in (Precision.INT8, Precision.DYNAMIC):
        return None
    try:
        return measure(path, reasons(float_nodes, asked, retried))
    except Exception:  # noqa: BLE001 - an unreadable layout only costs the figure
        return None
