"""Read a .tflite flatbuffer without running it: I/O (named as its signature names them), quantization,
operator counts over every subgraph, and a precision guess from what the operators compute in.

The flatbuffer is read with the schema module that ships inside ``ai_edge_litert`` (it needs only the
``flatbuffers`` package), so inspecting an artifact never imports TensorFlow. TensorFlow's copy of the same
schema is the fallback when LiteRT is not installed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.errors import MissingDependency, UsageError
from toolkit.runtimes.inspection import ModelInfo
from toolkit.model.tensors import Quantization, TensorSpec
from toolkit.model.vocabulary import Format, Precision

# Operators that only convert between float and integer: they never count as computing in integer.
CONVERSION_OPS = frozenset({"QUANTIZE", "DEQUANTIZE"})
_INTEGER_TYPES = frozenset({"int8", "uint8", "int16", "int4"})
_FLOAT_TYPES = frozenset({"float32", "float16", "float64", "bfloat16"})
_NUMPY_NAMES = {
    "FLOAT32": "float32",
    "FLOAT16": "float16",
    "FLOAT64": "float64",
    "INT32": "int32",
    "INT64": "int64",
    "INT16": "int16",
    "INT8": "int8",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "BOOL": "bool",
    "STRING": "object",
    "COMPLEX64": "complex64",
    "COMPLEX128": "complex128",
    "INT4": "int4",
    "BFLOAT16": "bfloat16",
}


def flatbuffer_schema() -> Any:
    """The flatbuffer schema module (generated code: Any)."""
    try:
        from ai_edge_litert import schema_py_generated

        return schema_py_generated
    except ImportError:
        pass
    try:
        from tensorflow.lite.python import schema_py_generated  # type: ignore[no-redef,unused-ignore]

        return schema_py_generated
    except ImportError as exc:
        raise MissingDependency("ai-edge-litert", extra="litert", purpose="Reading a .tflite file") from exc


@dataclass(frozen=True)
class OpView:
    """One operator: its builtin name and the dtypes of what it reads and writes."""

    name: str
    input_types: tuple[str, ...]
    output_types: tuple[str, ...]
    output_names: tuple[str, ...]


@dataclass(frozen=True)
class TFLiteContents:
    """The parts of a TFLite model the toolkit reads: main-graph I/O and every operator of every subgraph."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    input_indices: tuple[int, ...]
    output_indices: tuple[int, ...]
    ops: tuple[OpView, ...]
    subgraphs: int
    signatures: tuple[str, ...]


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise UsageError(f"{path} does not exist or is not a file.", hint="Pass a .tflite model file.")
    return path.read_bytes()


def parse_tflite(path: Path) -> TFLiteContents:
    """Parse ``path``; anything that is not a TFLite flatbuffer raises :class:`UsageError`."""
    data = _read_bytes(path)
    schema = flatbuffer_schema()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise UsageError(
            f"{path} is not a TFLite model (no TFL3 flatbuffer identifier).",
            hint="Pass a .tflite file written by a TFLite converter; the file may be truncated or another format.",
        )
    try:
        model = schema.ModelT.InitFromPackedBuf(data, 0)
        return _contents(model, schema)
    except UsageError:
        raise
    except Exception as exc:  # a damaged flatbuffer fails anywhere inside the generated reader  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
        raise UsageError(
            f"{path} is not a readable TFLite model ({type(exc).__name__}: {exc}).",
            hint="The file is probably truncated or corrupt; convert it again.",
        ) from None


def schema_names(schema: Any) -> tuple[dict[int, str], dict[int, str]]:
    """The schema's (Any: generated code) tensor type and builtin operator names by their codes."""
    def names(enum: Any) -> dict[int, str]:  # Any: generated schema code
        return {int(v): str(k) for k, v in vars(enum).items() if not k.startswith("_")}

    return names(schema.TensorType), names(schema.BuiltinOperator)


def op_code_names(schema: Any, model: Any) -> list[str]:  # Any: generated schema code and objects
    """The builtin operator name of each of ``model``'s operator codes, by code index (``BUILTIN_N`` for a code
    this schema does not name; ``CUSTOM`` for a custom op)."""
    _, op_names = schema_names(schema)
    codes = [max(int(code.builtinCode), int(code.deprecatedBuiltinCode)) for code in model.operatorCodes or []]
    return [op_names.get(code, f"BUILTIN_{code}") for code in codes]


def main_graph_ops(path: Path) -> list[str]:
    """The builtin operator name of each operator of the main graph of the .tflite at ``path``, in order."""
    schema = flatbuffer_schema()
    model = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    names = op_code_names(schema, model)
    return [names[op.opcodeIndex] for op in model.subgraphs[0].operators]


def tensor_dtype(type_names: dict[int, str], tensor: Any) -> str:
    """A schema tensor's (Any: generated code) numpy dtype name; the schema's own name, lower-cased, beyond those."""
    name = type_names.get(tensor.type, "")
    return _NUMPY_NAMES.get(name, name.lower() or "unknown")


def _contents(model: Any, schema: Any) -> TFLiteContents:  # Any: generated schema objects
    type_names, op_names = schema_names(schema)

    def dtype_of(tensor: Any) -> str:  # Any: generated schema code
        return tensor_dtype(type_names, tensor)

    def op_name(code: Any) -> str:  # Any: generated schema code
        builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
        name = op_names.get(builtin, f"BUILTIN_{builtin}")
        if name == "CUSTOM":
            custom = code.customCode.decode() if isinstance(code.customCode, bytes) else str(code.customCode)
            return f"CUSTOM:{custom}"
        return str(name)

    subgraphs = model.subgraphs or []
    if not subgraphs:
        raise UsageError("The TFLite model has no subgraph.", hint="Convert the model again.")
    main = subgraphs[0]
    tensors = main.tensors or []
    in_names: dict[int, str] = {}
    out_names: dict[int, str] = {}
    signature_keys: list[str] = []
    for sig in model.signatureDefs or []:
        if sig.subgraphIndex not in (0, None):
            continue
        signature_keys.append(schema_text(sig.signatureKey))
        for item in sig.inputs or []:
            in_names[item.tensorIndex] = schema_text(item.name)
        for item in sig.outputs or []:
            out_names[item.tensorIndex] = schema_text(item.name)
        break  # the first signature of the main graph names the I/O

    def spec(index: int, names: dict[int, str]) -> TensorSpec:
        tensor = tensors[index]
        shape_sig = (
            tensor.shapeSignature
            if tensor.shapeSignature is not None and len(tensor.shapeSignature)
            else None
        )
        dims = shape_sig if shape_sig is not None else (tensor.shape if tensor.shape is not None else [])
        shape = tuple(None if int(d) < 0 else int(d) for d in dims)
        return TensorSpec(
            name=names.get(index, schema_text(tensor.name)),
            shape=shape,
            dtype=dtype_of(tensor),
            quantization=_quantization(tensor.quantization),
        )

    inputs = tuple(int(i) for i in (main.inputs if main.inputs is not None else []))
    outputs = tuple(int(i) for i in (main.outputs if main.outputs is not None else []))
    ops: list[OpView] = []
    codes = model.operatorCodes or []
    for graph in subgraphs:
        graph_tensors = graph.tensors or []
        for op in graph.operators or []:
            ins = [int(i) for i in (op.inputs if op.inputs is not None else []) if int(i) >= 0]
            outs = [int(i) for i in (op.outputs if op.outputs is not None else []) if int(i) >= 0]
            ops.append(
                OpView(
                    name=op_name(codes[op.opcodeIndex]),
                    input_types=tuple(dtype_of(graph_tensors[i]) for i in ins),
                    output_types=tuple(dtype_of(graph_tensors[i]) for i in outs),
                    output_names=tuple(schema_text(graph_tensors[i].name) for i in outs),
                )
            )
    return TFLiteContents(
        inputs=tuple(spec(i, in_names) for i in inputs),
        outputs=tuple(spec(i, out_names) for i in outputs),
        input_indices=inputs,
        output_indices=outputs,
        ops=tuple(ops),
        subgraphs=len(subgraphs),
        signatures=tuple(signature_keys),
    )


def schema_text(value: Any) -> str:  # Any: a schema string field (bytes or str)
    """A name field of the flatbuffer as text (the generated code gives bytes or str, or None: '')."""
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _quantization(params: Any) -> Quantization | None:  # Any: generated schema code
    if params is None or params.scale is None or len(params.scale) == 0:
        return None
    scale = tuple(float(s) for s in params.scale)
    zero = tuple(int(z) for z in (params.zeroPoint if params.zeroPoint is not None else [0] * len(scale)))
    if all(s == 0.0 for s in scale):
        return None
    return Quantization(
        scale=scale, zero_point=zero, axis=int(params.quantizedDimension) if len(scale) > 1 else None
    )


def is_integer_op(op: OpView) -> bool:
    """True when ``op`` computes in integer: any int8/uint8/int16 operand (weights of a dynamic-range op
    included), except the QUANTIZE/DEQUANTIZE ops that only convert."""
    if op.name in CONVERSION_OPS:
        return False
    return any(t in _INTEGER_TYPES for t in op.input_types + op.output_types)


def _is_integer_activation_op(op: OpView) -> bool:
    return op.name not in CONVERSION_OPS and any(t in _INTEGER_TYPES for t in op.output_types)


def _is_float_op(op: OpView) -> bool:
    return (
        op.name not in CONVERSION_OPS
        and not is_integer_op(op)
        and any(t in _FLOAT_TYPES for t in op.output_types)
    )


def guess_precision(contents: TFLiteContents) -> Precision:
    """int8 when operators produce integer activations; dynamic when only their weights are integer
    (hybrid kernels); fp16 when float16 weights are dequantized at load; else fp32."""
    if any(_is_integer_activation_op(op) for op in contents.ops):
        return Precision.INT8
    if any(is_integer_op(op) for op in contents.ops):
        return Precision.DYNAMIC
    if any(op.name == "DEQUANTIZE" and "float16" in op.input_types for op in contents.ops):
        return Precision.FP16
    return Precision.FP32


def inspect_tflite(path: Path) -> ModelInfo:
    """I/O, quantization, op counts (all subgraphs), integer vs float compute ops, and a precision guess."""
    contents = parse_tflite(path)
    counts = Counter(op.name for op in contents.ops)
    quantized = sum(1 for op in contents.ops if is_integer_op(op))
    hybrid = sum(1 for op in contents.ops if is_integer_op(op) and not _is_integer_activation_op(op))
    floating = sum(1 for op in contents.ops if _is_float_op(op))
    return ModelInfo(
        path=str(path),
        format=Format.TFLITE,
        bytes=path.stat().st_size,
        inputs=contents.inputs,
        outputs=contents.outputs,
        op_counts=dict(counts),
        quantized_ops=quantized,
        float_compute_ops=floating,
        precision=guess_precision(contents),
        extra={
            "subgraphs": contents.subgraphs,
            "signatures": list(contents.signatures),
            "hybrid_ops": hybrid,
        },
    )


def float_ops(path: Path) -> list[tuple[str, str]]:
    """``(op kind, output tensor name)`` of every operator that still computes in float (what selective
    quantization kept, asked for or not)."""
    return [(op.name, name) for op in parse_tflite(path).ops if _is_float_op(op) for name in op.output_names]


def float_op_outputs(path: Path) -> list[str]:
    """Output tensor names of the operators that still compute in float (what selective quantization kept)."""
    return [name for _kind, name in float_ops(path)]
