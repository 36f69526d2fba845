#!/usr/bin/env python3
"""Measure which builtin operator versions an installed TFLite runtime resolves (toolkit/runtimes/compat.py's tables).

Two steps, because the runtime under test lives in its own environment (tflite-runtime 2.14 needs numpy < 2):

    .venv/bin/python scripts/probe_tflite_op_versions.py generate DIR        # TensorFlow + ai-edge-litert
    /path/to/legacy/bin/python scripts/probe_tflite_op_versions.py probe DIR  # prints {op: max version}

``generate`` converts a one-layer Keras model and writes, for every builtin op and version 1-15, a copy with
one extra (unused) operator code ``(op, version)``. An interpreter resolves every operator code while it is
built, so ``probe`` learns, from whether ``Interpreter(model_path=...)`` says "Didn't find op for builtin
opcode", the highest version of each op the runtime registers.
"""

import json
import os
import sys

MAX_VERSION = 15
SKIP = ("CUSTOM", "DELEGATE", "PLACEHOLDER_FOR_GREATER_OP_CODES")
UNRESOLVED = ("Didn't find op", "out of range", "Registration failed")


def generate(folder):
    import flatbuffers
    import tensorflow as tf
    from ai_edge_litert import schema_py_generated as schema

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    data = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    os.makedirs(folder, exist_ok=True)
    for name, code in vars(schema.BuiltinOperator).items():
        if name.startswith("_") or name in SKIP:
            continue
        for version in range(1, MAX_VERSION + 1):
            patched = schema.ModelT.InitFromPackedBuf(data, 0)
            extra = schema.OperatorCodeT()
            extra.builtinCode = code
            extra.deprecatedBuiltinCode = min(code, 127)
            extra.version = version
            patched.operatorCodes.append(extra)
            builder = flatbuffers.Builder(0)
            builder.Finish(patched.Pack(builder), file_identifier=b"TFL3")
            with open(os.path.join(folder, f"{name}.{version}.tflite"), "wb") as handle:
                handle.write(builder.Output())


def probe(folder):
    try:
        from tflite_runtime.interpreter import Interpreter
    except ImportError:
        from ai_edge_litert.interpreter import Interpreter
    best = {}
    for file in sorted(os.listdir(folder)):
        name, version, _ = file.rsplit(".", 2)
        try:
            Interpreter(model_path=os.path.join(folder, file))
            resolved = True
        except Exception as exc:  # noqa: BLE001 (the runtime raises ValueError/RuntimeError by version)
            resolved = not any(text in str(exc) for text in UNRESOLVED)
        best.setdefault(name, 0)
        if resolved:
            best[name] = max(best[name], int(version))
    print(json.dumps({k: v for k, v in sorted(best.items()) if v}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("generate", "probe"):
        sys.exit(__doc__)
    (generate if sys.argv[1] == "generate" else probe)(sys.argv[2])
