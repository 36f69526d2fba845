"""Will the device's runtime load this artifact? Checked on the host, before a bundle ships.

tflite-runtime 2.14 (its last release; many deployed Raspberry Pi and Coral images still carry it) knows fewer
builtin operator VERSIONS than the TF 2.21 converter writes: a dynamic-range model carries FULLY_CONNECTED
version 12, and 2.14 stops at 10 (``Didn't find op for builtin opcode 'FULLY_CONNECTED' version '12'``).
The interpreter resolves every operator code of the flatbuffer before it runs anything, so comparing the file's
``(op, version)`` pairs with what the runtime registers is exact.

``TFLITE_RUNTIME_2_14`` was MEASURED, not copied from a document: ``scripts/probe_tflite_op_versions.py``
appends one extra operator code ``(op, version)`` to a tiny model for every builtin op and version 1-15, and
asks tflite-runtime 2.14.0 (numpy 1.26) to build an interpreter for each; the highest version it resolves is
the entry. Builtin ops it does not resolve at any version (the StableHLO ops among them) are absent. Custom ops
(``edgetpu-custom-op``, Flex ops) are not builtins: they need a delegate or a Flex build, and are reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from toolkit.model.vocabulary import Runtime

# Highest version of each builtin operator that tflite-runtime 2.14.0 resolves (measured, see above).
TFLITE_RUNTIME_2_14: Mapping[str, int] = {
    "ABS": 5, "ADD": 5, "ADD_N": 1, "ARG_MAX": 3, "ARG_MIN": 3, "ASSIGN_VARIABLE": 1, "ATAN2": 1,
    "AVERAGE_POOL_2D": 3, "BATCH_MATMUL": 4, "BATCH_TO_SPACE_ND": 4, "BIDIRECTIONAL_SEQUENCE_LSTM": 3,
    "BIDIRECTIONAL_SEQUENCE_RNN": 3, "BITCAST": 1, "BITWISE_XOR": 1, "BROADCAST_ARGS": 1, "BROADCAST_TO": 3,
    "BUCKETIZE": 1, "CALL_ONCE": 1, "CAST": 5, "CEIL": 1, "COMPLEX_ABS": 1, "CONCATENATION": 4, "CONV_2D": 7,
    "CONV_3D": 1, "CONV_3D_TRANSPOSE": 1, "COS": 1, "CUMSUM": 1, "DENSIFY": 1, "DEPTHWISE_CONV_2D": 7,
    "DEPTH_TO_SPACE": 2, "DEQUANTIZE": 5, "DIV": 2, "DYNAMIC_UPDATE_SLICE": 1, "ELU": 1, "EMBEDDING_LOOKUP": 3,
    "EMBEDDING_LOOKUP_SPARSE": 1, "EQUAL": 4, "EXP": 2, "EXPAND_DIMS": 1, "FAKE_QUANT": 2, "FILL": 4, "FLOOR": 1,
    "FLOOR_DIV": 3, "FLOOR_MOD": 2, "FULLY_CONNECTED": 10, "GATHER": 6, "GATHER_ND": 4, "GELU": 2, "GREATER": 2,
    "GREATER_EQUAL": 3, "HARD_SWISH": 1, "HASHTABLE": 1, "HASHTABLE_FIND": 1, "HASHTABLE_IMPORT": 1,
    "HASHTABLE_LOOKUP": 1, "HASHTABLE_SIZE": 1, "IF": 1, "IMAG": 1, "L2_NORMALIZATION": 2, "L2_POOL_2D": 1,
    "LEAKY_RELU": 2, "LESS": 3, "LESS_EQUAL": 2, "LOCAL_RESPONSE_NORMALIZATION": 1, "LOG": 1, "LOGICAL_AND": 1,
    "LOGICAL_NOT": 1, "LOGICAL_OR": 1, "LOGISTIC": 3, "LOG_SOFTMAX": 2, "LSH_PROJECTION": 1, "LSTM": 4,
    "MATRIX_DIAG": 1, "MATRIX_SET_DIAG": 1, "MAXIMUM": 4, "MAX_POOL_2D": 3, "MEAN": 3, "MINIMUM": 4,
    "MIRROR_PAD": 3, "MUL": 7, "MULTINOMIAL": 1, "NEG": 1, "NON_MAX_SUPPRESSION_V4": 1, "NON_MAX_SUPPRESSION_V5": 1,
    "NOT_EQUAL": 3, "ONE_HOT": 1, "PACK": 4, "PAD": 4, "PADV2": 4, "POW": 1, "PRELU": 1, "QUANTIZE": 3,
    "RANDOM_STANDARD_NORMAL": 1, "RANDOM_UNIFORM": 1, "RANGE": 2, "RANK": 1, "READ_VARIABLE": 1, "REAL": 1,
    "REDUCE_ALL": 1, "REDUCE_ANY": 1, "REDUCE_MAX": 3, "REDUCE_MIN": 3, "REDUCE_PROD": 2, "RELU": 3, "RELU6": 3,
    "RELU_0_TO_1": 1, "RELU_N1_TO_1": 1, "RESHAPE": 1, "RESIZE_BILINEAR": 4, "RESIZE_NEAREST_NEIGHBOR": 4,
    "REVERSE_SEQUENCE": 1, "REVERSE_V2": 3, "RFFT2D": 1, "RIGHT_SHIFT": 1, "RNN": 3, "ROUND": 1, "RSQRT": 2,
    "SCATTER_ND": 1, "SEGMENT_SUM": 1, "SELECT": 4, "SELECT_V2": 2, "SHAPE": 1, "SIGN": 2, "SIN": 1, "SKIP_GRAM": 1,
    "SLICE": 6, "SOFTMAX": 3, "SPACE_TO_BATCH_ND": 4, "SPACE_TO_DEPTH": 2, "SPARSE_TO_DENSE": 3, "SPLIT": 4,
    "SPLIT_V": 2, "SQRT": 1, "SQUARE": 1, "SQUARED_DIFFERENCE": 2, "SQUEEZE": 2, "STRIDED_SLICE": 8, "SUB": 5,
    "SUM": 2, "SVDF": 4, "TANH": 3, "TILE": 3, "TOPK_V2": 3, "TRANSPOSE": 6, "TRANSPOSE_CONV": 4,
    "UNIDIRECTIONAL_SEQUENCE_LSTM": 4, "UNIDIRECTIONAL_SEQUENCE_RNN": 3, "UNIQUE": 1, "UNPACK": 4,
    "UNSORTED_SEGMENT_MAX": 1, "UNSORTED_SEGMENT_MIN": 1, "UNSORTED_SEGMENT_PROD": 1, "UNSORTED_SEGMENT_SUM": 1,
    "VAR_HANDLE": 1, "WHERE": 2, "WHILE": 1, "ZEROS_LIKE": 1,
}

# Ops whose int8 kernel tflite-runtime 2.14.0 lacks although it knows the version the TF 2.21 converter writes
# for them: the interpreter loads the model and fails when it runs the op. MEASURED: the INT8 DIV of a trained
# model (logits divided by a softplus temperature, tests/fixtures/share_models.py) is DIV version 1, and
# tflite-runtime 2.14.0 stops at its first invoke with "Div only supports FLOAT32, INT32 and quantized UINT8
# now, got 9 (int8). Node number 10 (DIV) failed to invoke" (findings.md 6: an INT8 DIV fails at run time).
TFLITE_RUNTIME_2_14_NO_INT8 = frozenset({"DIV"})

# runtime name -> (version prefix it covers, op table). A runtime bounded at or below one of these versions gets
# its table; newer runtimes (LiteRT, TensorFlow 2.21) load everything this toolkit's converters write.
_TABLES: tuple[tuple[Runtime, tuple[int, ...], Mapping[str, int]], ...] = (
    (Runtime.TFLITE_RUNTIME, (2, 14), TFLITE_RUNTIME_2_14),
)
_NO_INT8: Mapping[tuple[Runtime, str], frozenset[str]] = {(Runtime.TFLITE_RUNTIME, "2.14"): TFLITE_RUNTIME_2_14_NO_INT8}


@dataclass(frozen=True)
class OpVersion:
    """One builtin (or custom) operator code of a .tflite file and the highest version the file uses."""

    name: str
    version: int
    custom: bool = False


def tflite_op_versions(path: Path) -> dict[str, OpVersion]:
    """Every operator code in the flatbuffer (used or not), by name, with its highest version.

    Read with the schema module :mod:`toolkit.runtimes.inspection.tflite` uses, so no runtime is imported.
    """
    from toolkit.runtimes.inspection import tflite as inspection

    inspection.parse_tflite(path)  # refuses a file that is not a TFLite flatbuffer, with a plain message
    schema = inspection.flatbuffer_schema()
    model = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    found: dict[str, OpVersion] = {}
    for code, name in zip(model.operatorCodes or [], inspection.op_code_names(schema, model)):
        custom = name == "CUSTOM"
        if custom:
            raw = code.customCode
            name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        version = int(code.version or 1)
        previous = found.get(name)
        if previous is None or version > previous.version:
            found[name] = OpVersion(name, version, custom)
    return found


def op_table_for(runtime: str, max_version: str | None) -> tuple[str, Mapping[str, int]] | None:
    """The measured op table that bounds ``runtime`` when the profile caps it at ``max_version``, with the
    version it was measured on; None when the runtime is unbounded or newer than every table."""
    if max_version is None:
        return None
    from toolkit.model.targets import parse_version

    bound = parse_version(max_version)
    if bound is None:
        return None
    for name, version, table in _TABLES:
        if name == runtime and tuple(bound[:2]) <= version:
            return ".".join(str(v) for v in version), table
    return None


def tflite_incompatibilities(path: Path, runtime: str, max_version: str | None) -> list[str]:
    """Why ``runtime`` (capped at ``max_version``) cannot load the .tflite at ``path``; empty when it can.

    Each entry names the operator, the version the file carries and the highest the runtime knows.
    """
    bounded = op_table_for(runtime, max_version)
    if bounded is None:
        return []
    measured, table = bounded
    problems: list[str] = []
    for op in sorted(tflite_op_versions(path).values(), key=lambda o: o.name):
        if op.custom:
            problems.append(f"custom op {op.name!r} (needs a delegate or a runtime built with it)")
        elif op.name not in table:
            problems.append(f"{op.name} (not a builtin op {runtime} {measured} knows)")
        elif op.version > table[op.name]:
            problems.append(f"{op.name} version {op.version} ({runtime} {measured} knows up to {table[op.name]})")
    versions = tflite_op_versions(path)
    for name in sorted(_int8_ops(path) & _NO_INT8.get((Runtime(runtime), measured), frozenset())):
        problems.append(f"{name} version {versions[name].version} (int8: {runtime} {measured} has no int8 {name} "
                        "kernel and fails when it runs it)")
    return problems


def _int8_ops(path: Path) -> set[str]:
    """The builtin ops of the .tflite at ``path`` that read an int8 tensor as their first input."""
    from toolkit.runtimes.inspection import tflite as inspection

    schema = inspection.flatbuffer_schema()
    model = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    codes = inspection.op_code_names(schema, model)
    return {codes[op.opcodeIndex] for graph in model.subgraphs or [] for op in graph.operators or []
            if op.inputs is not None and len(op.inputs) and op.inputs[0] >= 0
            and graph.tensors[op.inputs[0]].type == schema.TensorType.INT8}
