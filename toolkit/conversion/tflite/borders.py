"""Integer I/O around float islands of a mixed int8/float TFLite model: a QUANTIZE -> DEQUANTIZE pair at each
float I/O tensor whose neighbouring op is kept float, with the scale the calibration measured on that tensor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any  # Any: the generated TFLite flatbuffer schema objects (untyped)

from toolkit.compat import tensorflow as tf_compat
from toolkit.model.artifact import FloatIO
from toolkit.model.vocabulary import FloatIOReason, TensorRole

INT8_LEVELS = 255.0  # an int8 tensor's range in quantization steps


def _int8_params(low: float, high: float) -> tuple[float, int]:
    """(scale, zero point) of an int8 tensor covering [low, high] (and 0), as the TFLite quantizer sets them."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = (high - low) / INT8_LEVELS if high > low else 1.0
    return scale, int(min(127, max(-128, round(-128 - low / scale))))


def _tensor_ranges(calibrated: bytes) -> dict[str, tuple[float, float]]:
    """Tensor name -> the (min, max) the calibration recorded on it (main graph)."""
    graph = tf_compat.model_object(calibrated).subgraphs[0]
    ranges = {}
    for tensor in graph.tensors or []:
        q = tensor.quantization
        if q is not None and q.min is not None and q.max is not None and len(q.min) == 1 and len(q.max) == 1:
            ranges[_text(tensor.name)] = (float(q.min[0]), float(q.max[0]))
    return ranges


def _text(raw: object) -> str:  # a flatbuffer name: bytes or str
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class _Graph:
    """The main graph of a TFLite model object (``schema_py_generated`` objects: untyped, hence ``Any``), with the
    ops and tensors the border pairs add."""

    def __init__(self, obj: Any) -> None:
        from tensorflow.lite.python import schema_py_generated as fb

        self.fb, self.obj = fb, obj
        self.graph = obj.subgraphs[0]
        self.tensors = self.graph.tensors
        self.kind = [self._code(obj.operatorCodes[op.opcodeIndex]) for op in self.graph.operators]
        self.front: list[Any] = []
        self.back: list[Any] = []

    @staticmethod
    def _code(op_code: Any) -> int:
        return max(int(op_code.builtinCode), int(op_code.deprecatedBuiltinCode))

    def opcode(self, code: int) -> int:
        for index, op_code in enumerate(self.obj.operatorCodes):
            if self._code(op_code) == code:
                return index
        new = self.fb.OperatorCodeT()
        new.builtinCode = new.deprecatedBuiltinCode = code
        new.version = 2 if code == self.fb.BuiltinOperator.DEQUANTIZE else 1  # int8 DEQUANTIZE is version 2
        self.obj.operatorCodes.append(new)
        return len(self.obj.operatorCodes) - 1

    def add_tensor(self, like: Any, name: str, *, int8: tuple[float, int] | None) -> int:
        tensor = self.fb.TensorT()
        tensor.name = name.encode()
        tensor.shape = like.shape
        tensor.shapeSignature = like.shapeSignature
        tensor.buffer = 0
        tensor.type = self.fb.TensorType.INT8 if int8 else self.fb.TensorType.FLOAT32
        if int8:
            tensor.quantization = self.fb.QuantizationParametersT()
            tensor.quantization.scale, tensor.quantization.zeroPoint = [int8[0]], [int8[1]]
        self.tensors.append(tensor)
        return len(self.tensors) - 1

    def add_op(self, code: int, source: int, target: int) -> Any:
        op = self.fb.OperatorT()
        op.opcodeIndex = self.opcode(code)
        op.inputs, op.outputs = [source], [target]
        return op

    def readers(self, index: int, *, quantize: bool) -> list[Any]:
        """The ops reading tensor ``index`` that are (``quantize``) or are not QUANTIZE ops."""
        code = self.fb.BuiltinOperator.QUANTIZE
        return [op for op, k in zip(self.graph.operators, self.kind)
                if index in list(op.inputs) and (k == code) == quantize]

    def is_border(self, role: TensorRole, index: int) -> bool:
        """Whether float I/O tensor ``index`` touches a float op (an input read by a non-QUANTIZE op, an output
        not written by a DEQUANTIZE)."""
        if role is TensorRole.INPUT:
            return bool(self.readers(index, quantize=False))
        producer = [k for op, k in zip(self.graph.operators, self.kind) if index in list(op.outputs)]
        return bool(producer) and producer[0] != self.fb.BuiltinOperator.DEQUANTIZE

    def quantize_input(self, index: int, params: tuple[float, int]) -> None:
        """int8 input -> DEQUANTIZE -> the float readers (the quantized readers' QUANTIZE moves first and gives
        the int8 tensor, when there is one)."""
        quantize, dequantize = self.fb.BuiltinOperator.QUANTIZE, self.fb.BuiltinOperator.DEQUANTIZE
        tensor = self.tensors[index]
        floats = self.readers(index, quantize=False)
        quantized = self.readers(index, quantize=True)
        if quantized:
            self.graph.operators.remove(quantized[0])
            self.front.append(quantized[0])
            q_index = int(quantized[0].outputs[0])
        else:
            q_index = self.add_tensor(tensor, _text(tensor.name), int8=params)
            self.front.append(self.add_op(quantize, index, q_index))
        f_index = self.add_tensor(tensor, f"{_text(tensor.name)}/dequantized", int8=None)
        self.front.append(self.add_op(dequantize, q_index, f_index))
        for op in floats:
            op.inputs = [f_index if int(i) == index else int(i) for i in op.inputs]

    def quantize_output(self, index: int, params: tuple[float, int]) -> None:
        """The float writer -> QUANTIZE -> DEQUANTIZE -> the output (made integer by ``modify_model_io_type``)."""
        tensor = self.tensors[index]
        f_index = self.add_tensor(tensor, f"{_text(tensor.name)}/float", int8=None)
        for op in self.graph.operators:
            op.outputs = [f_index if int(i) == index else int(i) for i in op.outputs]
            op.inputs = [f_index if int(i) == index else int(i) for i in op.inputs]
        q_index = self.add_tensor(tensor, _text(tensor.name), int8=params)
        self.back += [self.add_op(self.fb.BuiltinOperator.QUANTIZE, f_index, q_index),
                      self.add_op(self.fb.BuiltinOperator.DEQUANTIZE, q_index, index)]


def int8_borders(
    model: bytes, calibrated: bytes, *, keep_float: Mapping[str, tuple[FloatIOReason, str]] | None = None
) -> tuple[bytes, tuple[FloatIO, ...]]:
    """Give every float I/O tensor of ``model`` whose neighbouring op is kept float a QUANTIZE -> DEQUANTIZE pair, with
    the scale calibration measured there, so ``modify_model_io_type`` can make that I/O integer and the float island
    sits inside the graph. ``keep_float`` names I/O that must stay float, with why (an output that mixes ranges).
    Returns the model and the I/O that stays float with the reason (the caller records it: ``FloatIO``)."""
    obj = tf_compat.model_object(model)
    graph = _Graph(obj)
    ranges = _tensor_ranges(calibrated)
    signature = obj.signatureDefs[0] if obj.signatureDefs else None
    public = {}  # tensor index -> the signature's (source) name
    if signature is not None:
        for item in [*(signature.inputs or []), *(signature.outputs or [])]:
            public[int(item.tensorIndex)] = _text(item.name)
    wanted = dict(keep_float or {})
    stays: list[FloatIO] = []
    for role, indices in ((TensorRole.INPUT, list(graph.graph.inputs)), (TensorRole.OUTPUT, list(graph.graph.outputs))):
        for index in map(int, indices):
            tensor = graph.tensors[index]
            name, tensor_name = public.get(index, _text(tensor.name)), _text(tensor.name)
            if tensor.type != graph.fb.TensorType.FLOAT32 or not graph.is_border(role, index):
                continue
            why = wanted.get(name, wanted.get(tensor_name))
            if why is None and tensor_name not in ranges:
                why = (FloatIOReason.NO_RANGE, "the calibration recorded no range for it, so it has no int8 scale")
            if why is not None:
                stays.append(FloatIO(name=name, role=role, reason=why[0], detail=why[1]))
            elif role is TensorRole.INPUT:
                graph.quantize_input(index, _int8_params(*ranges[tensor_name]))
            else:
                graph.quantize_output(index, _int8_params(*ranges[tensor_name]))
    graph.graph.operators = graph.front + list(graph.graph.operators) + graph.back
    return tf_compat.model_bytes(obj), tuple(stays)
