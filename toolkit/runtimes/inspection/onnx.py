"""What an .onnx file holds: I/O, operator counts (subgraphs included), how many compute nodes really run
quantized, and a precision guess from the content, so that an ``int8`` label is proven rather than assumed.

Quantized compute, as onnxruntime runs it:

* QOperator form: ``QLinear*``, ``QGemm``, ``ConvInteger``/``MatMulInteger`` (fed by
  ``DynamicQuantizeLinear`` in dynamic models), ``DynamicQuantizeMatMul`` and the other integer contrib ops;
* QDQ form: a compute node whose data input comes from ``DequantizeLinear``; onnxruntime fuses the
  DequantizeLinear -> op -> QuantizeLinear pattern into an integer kernel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.errors import MissingDependency, UsageError, key_line
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import Format, Precision
from toolkit.runtimes.inspection import ModelInfo

if TYPE_CHECKING:
    import onnx


def load_onnx(path: Path, *, load_external_data: bool = True) -> onnx.ModelProto:
    """Parse ``path`` as an ONNX model; a file that is not one (truncated, corrupt, another format) is a
    :class:`UsageError` with a plain message rather than a protobuf traceback."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - the onnx extra is part of every test run
        raise MissingDependency("onnx", extra="onnx", purpose="Reading an ONNX model") from exc
    if not path.is_file():
        raise UsageError(f"{path} does not exist or is not a file.", hint="Pass the path of an .onnx file.")
    try:
        model = onnx.load(str(path), load_external_data=load_external_data)
    except FileNotFoundError as exc:
        raise UsageError(
            f"{path} refers to external weight data that is missing: {exc.filename or exc}.",
            hint="Keep the .onnx file and its external data file(s) in the same directory.",
        ) from exc
    except Exception as exc:  # protobuf DecodeError, UnicodeDecodeError, ValueError ...
        raise UsageError(
            f"{path} is not a readable ONNX model (truncated or corrupt: {key_line(exc)}).",
            hint="Re-export or re-download the model file.",
        ) from exc
    if not model.HasField("graph") or not model.opset_import or len(model.graph.output) == 0:
        raise UsageError(
            f"{path} is not a complete ONNX model (no graph, opset or outputs; the file is probably truncated).",
            hint="Re-export or re-download the model file.",
        )
    return model


def _dims(value_info: onnx.ValueInfoProto) -> tuple[int | None, ...]:
    """A value_info's shape: ints where fixed, None for symbolic or unknown dimensions."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return ()
    return tuple(
        int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None
        for d in tensor_type.shape.dim
    )


def _dtype(value_info: onnx.ValueInfoProto) -> str:
    import onnx

    elem = value_info.type.tensor_type.elem_type
    if not elem:
        return "float32"
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)))


def tensor_specs(model: onnx.ModelProto) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Graph inputs (initializers excluded: old exporters list weights as inputs) and outputs."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(
        TensorSpec(vi.name, _dims(vi), _dtype(vi)) for vi in model.graph.input if vi.name not in initializers
    )
    outputs = tuple(TensorSpec(vi.name, _dims(vi), _dtype(vi)) for vi in model.graph.output)
    return inputs, outputs


# Integer kernels of the QOperator form (ai.onnx and com.microsoft).
INTEGER_OPS = frozenset(
    {
        "ConvInteger",
        "MatMulInteger",
        "QGemm",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "QAttention",
        "DynamicQuantizeLSTM",
        "QEmbedLayerNormalization",
        "QOrderedMatMul",
        "MatMulNBits",
    }
)
# Nodes that only move data between float and integer; neither "compute" nor "float compute".
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# The heavy compute that decides speed; counted as float compute when not quantized.
COMPUTE_OPS = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "MatMul",
        "Gemm",
        "Einsum",
        "LSTM",
        "GRU",
        "RNN",
        "Attention",
        "FusedConv",
        "FusedMatMul",
    }
)
_FLOAT16 = 10  # onnx.TensorProto.FLOAT16
_FLOAT = 1


def is_integer_op(op_type: str) -> bool:
    return op_type.startswith("QLinear") or op_type in INTEGER_OPS


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph below it (If branches, Loop and Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from iter_graphs(attr.g)
            for sub in attr.graphs:
                yield from iter_graphs(sub)


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for sub in iter_graphs(graph):
        yield from sub.node


def quantized_node_names(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes that run quantized (see the module docstring), in every subgraph.

    In QDQ form a node counts when every float input it reads comes from a DequantizeLinear (weights and
    bias included) and it is heavy compute or its result is quantized again (the pattern onnxruntime fuses);
    a node left in float by ``nodes_to_exclude`` reads a float weight or feeds no QuantizeLinear."""
    producers: dict[str, str] = {}
    consumers: dict[str, list[str]] = {}
    elem_types: dict[str, int] = {}
    non_float: set[str] = set()
    for graph in iter_graphs(model.graph):
        for init in graph.initializer:
            if init.data_type not in (_FLOAT, _FLOAT16):
                non_float.add(init.name)
        for vi in [*graph.input, *graph.output, *graph.value_info]:
            if vi.type.tensor_type.elem_type:
                elem_types[vi.name] = vi.type.tensor_type.elem_type
        for node in graph.node:
            for out in node.output:
                producers[out] = node.op_type
            for name in node.input:
                consumers.setdefault(name, []).append(node.op_type)
    names = []
    for node in iter_nodes(model.graph):
        if node.op_type in QDQ_OPS:
            continue
        if is_integer_op(node.op_type):
            names.append(node.name or f"<{node.op_type}>")
            continue
        data = [
            i
            for i in node.input
            if i and i not in non_float and elem_types.get(i, _FLOAT) in (_FLOAT, _FLOAT16)
        ]
        if not data or not all(producers.get(i) == "DequantizeLinear" for i in data):
            continue
        requantized = any("QuantizeLinear" in consumers.get(out, ()) for out in node.output)
        if node.op_type in COMPUTE_OPS or requantized:
            names.append(node.name or f"<{node.op_type}>")
    return names


def _count_float16(model: onnx.ModelProto) -> tuple[int, int]:
    """(fp16, fp32) initializer counts, Constant node values included."""
    half = full = 0
    for graph in iter_graphs(model.graph):
        tensors = list(graph.initializer)
        tensors += [
            a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.HasField("t")
        ]
        for tensor in tensors:
            half += tensor.data_type == _FLOAT16
            full += tensor.data_type == _FLOAT
    return half, full


def guess_precision(op_counts: Counter[str], quantized: int, model: onnx.ModelProto) -> Precision:
    """int8 (activations quantized: QuantizeLinear or QLinear ops), dynamic (DynamicQuantizeLinear /
    integer matmuls without static activation quantization), fp16 (mostly half weights), else fp32."""
    static = op_counts.get("QuantizeLinear", 0) > 0 or any(
        op.startswith("QLinear") or op == "QGemm" for op in op_counts
    )
    if quantized and static:
        return Precision.INT8
    if quantized or op_counts.get("DynamicQuantizeLinear", 0):
        return Precision.DYNAMIC
    half, full = _count_float16(model)
    if half and half >= full:
        return Precision.FP16
    return Precision.FP32


def _quant_types(model: onnx.ModelProto) -> dict[str, str]:
    """Activation/weight integer types of a static QDQ model, read from its QuantizeLinear zero points."""
    import onnx

    inits = {t.name: t for g in iter_graphs(model.graph) for t in g.initializer}
    act: set[str] = set()
    for node in iter_nodes(model.graph):
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in inits:
            act.add(onnx.helper.tensor_dtype_to_np_dtype(inits[node.input[2]].data_type).name)
    return {"activation_type": ",".join(sorted(act))} if act else {}


def inspect_onnx(path: Path) -> ModelInfo:
    """I/O, op counts (subgraphs included), quantized vs float compute nodes, precision guess and opset."""
    path = Path(path)
    model = load_onnx(path, load_external_data=False)
    inputs, outputs = tensor_specs(model)
    op_counts: Counter[str] = Counter(node.op_type for node in iter_nodes(model.graph))
    quantized = quantized_node_names(model)
    quantized_set = set(quantized)
    float_compute = sum(
        1
        for node in iter_nodes(model.graph)
        if node.op_type in COMPUTE_OPS and (node.name or f"<{node.op_type}>") not in quantized_set
    )
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    is_qoperator = any(is_integer_op(op) for op in op_counts)
    extra: dict[str, object] = {
        "ir_version": int(model.ir_version),
        "producer": f"{model.producer_name} {model.producer_version}".strip() or None,
        "opsets": {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        "quant_format": ("qoperator" if is_qoperator else "qdq") if quantized else None,
        "subgraphs": sum(1 for _ in iter_graphs(model.graph)) - 1,
        **_quant_types(model),
    }
    return ModelInfo(
        path=str(path),
        format=Format.ONNX,
        bytes=path.stat().st_size,
        inputs=inputs,
        outputs=outputs,
        op_counts=dict(op_counts),
        quantized_ops=len(quantized),
        float_compute_ops=float_compute,
        precision=guess_precision(op_counts, len(quantized), model),
        opset=opset,
        extra=extra,
    )
