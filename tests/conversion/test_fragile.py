"""Known-fragile patterns kept float up front on the Keras -> TFLite route: the trained YOLO-style detector
(tests/fixtures/real_models.py), whose head's final Concat mixes box coordinates (0-320) and class scores (0-1).

Plain INT8 (the rule switched off through ``tflite._has_output_concat``, the route's one switch into it) gives
that tensor one int8 scale and the scores collapse; with the rule the Concat, the pass-through ops after it and
the head's Sigmoid/box decoding behind it stay float, and the output the Concat writes stays float32 although
the profile asks for int8 I/O: recorded in the artifact's ``float_io`` (reason ``mixed_ranges``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.real_models import Detector, assert_rule_repairs
from tests.fixtures.token_models import token_net  # noqa: F401 (fixture)
from toolkit import api
from toolkit.conversion.tflite import convert as tflite


def _int8_record(detector: Detector, out: Path) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    api.convert(detector.model, calibration=detector.calibration, eval_data=detector.eval_data,
                precisions=["fp32", "int8"], formats=["tflite"], out=out, use_cache=False,
                progress=lambda message: None)
    seconds = time.perf_counter() - start
    manifest = json.loads((out / "manifest.json").read_text())
    (int8,) = [a for a in manifest["artifacts"] if a["precision"] == "int8"]
    return int8, seconds


@pytest.fixture(scope="module")
def detector_int8(yolo_detector: Detector, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("fragile")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tflite, "_has_output_concat", lambda model: False)  # the rule off: plain INT8
        plain, plain_s = _int8_record(yolo_detector, work / "plain")
    ruled, ruled_s = _int8_record(yolo_detector, work / "ruled")
    print(f"plain int8 {plain_s:.1f}s recall {plain['verification']['task_metrics']['recall']:.3f}; "
          f"with the rule {ruled_s:.1f}s recall {ruled['verification']['task_metrics']['recall']:.3f}")
    return {"plain": plain, "ruled": ruled}


def test_final_concat_rule_repairs_the_detector(detector_int8: dict[str, Any]) -> None:
    assert_rule_repairs(detector_int8["plain"], detector_int8["ruled"])


def test_rule_records_which_nodes_and_why(detector_int8: dict[str, Any]) -> None:
    ruled = detector_int8["ruled"]
    nodes = ruled["float_nodes"]
    assert nodes[0] == ruled["outputs"][0]["name"] or nodes[0].startswith("StatefulPartitionedCall"), nodes  # the Concat
    assert any("/scores_" in n and n.endswith("/Sigmoid") for n in nodes), nodes  # the scores' Sigmoid behind it
    notes = [n for n in ruled["notes"] if n.startswith("kept in float up front")]
    assert len(notes) == 1 and "final Concat" in notes[0] and "LOGISTIC" in notes[0], ruled["notes"]
    # the output the Concat writes stays float (one int8 scale would collapse it again); the input stays int8
    assert [i["dtype"] for i in ruled["inputs"]] == ["int8"]
    (output,) = ruled["outputs"]
    assert output["dtype"] == "float32"
    assert [(f["name"], f["role"], f["reason"]) for f in ruled["float_io"]] == [(output["name"], "output",
                                                                                  "mixed_ranges")]


# --------------------------------------------------------------------------------------------- integer inputs
# The first op after an integer input (an embedding's Gather) stays float: its rows come out exactly as in the
# float model. The same conversion with the rule off (the route's switch) rounds them: the check can fail.


def _token_request(source: Any, workdir: Path, fmt: str, calibration: Any) -> Any:
    from toolkit.conversion.base import ConversionRequest, as_input_dtype
    from toolkit.model.recipe import Recipe

    dtype = source.inputs[0].dtype
    feeds = tuple({"tokens": as_input_dtype(x[None], dtype)} for x in calibration)
    recipe = Recipe(format=fmt, precision="int8", io_dtype="int8") if fmt == "tflite" else Recipe(
        format=fmt, precision="int8")
    return ConversionRequest(source=source, recipe=recipe, input_shapes={"tokens": (1, 8)}, calibration=feeds,
                             workdir=workdir)


def test_onnx_embedding_gather_stays_exact(token_net, tmp_path) -> None:
    import numpy as np

    from toolkit.conversion import fragile, registry
    from toolkit.conversion.onnx.graph_io import require_onnx, run_outputs
    from toolkit.sources import open_source

    source = open_source(str(token_net.onnx))
    calibration = np.load(token_net.calibration)["tokens"][:64]
    feeds = [{"tokens": t[None]} for t in np.load(token_net.eval_data)["tokens"][:16]]
    onnx = require_onnx()
    reference = run_outputs(onnx.load(str(token_net.onnx)), ["/embed/Gather_output_0"], tmp_path, feeds)

    def embedding(path: Path) -> list[Any]:
        return run_outputs(onnx.load(str(path)), ["/embed/Gather_output_0"], tmp_path, feeds)["/embed/Gather_output_0"]

    ruled = registry.build(_token_request(source, tmp_path / "w1", "onnx", calibration), tmp_path / "ruled.onnx")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fragile, "_integer_input_readers", lambda graph, consumers: [])  # the rule off
        plain = registry.build(_token_request(source, tmp_path / "w2", "onnx", calibration), tmp_path / "plain.onnx")
    want = reference["/embed/Gather_output_0"]
    assert "/embed/Gather" in ruled.float_nodes and "/embed/Gather" not in plain.float_nodes
    assert any("first op after the integer input 'tokens'" in note for note in ruled.notes), ruled.notes
    exact = max(float(np.max(np.abs(a - b))) for a, b in zip(embedding(ruled.path), want))
    rounded = max(float(np.max(np.abs(a - b))) for a, b in zip(embedding(plain.path), want))
    print(f"onnx embedding max error: with the rule {exact}, without {rounded:.3g}")
    assert exact == 0.0 and rounded > 0.0


def test_tflite_embedding_gather_stays_exact(tmp_path) -> None:
    import keras
    import numpy as np

    from tests.fixtures.token_models import TOKENS, token_data
    from toolkit.conversion.tflite import convert as tflite
    from toolkit.runtimes.inspection.tflite import inspect_tflite
    from toolkit.sources import open_source

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(TOKENS, 16, name="embed")(inputs)
    x = keras.layers.Dense(32, activation="relu", name="token_hidden")(x)
    x = keras.layers.GlobalAveragePooling1D(name="token_mean")(x)
    model = keras.Model(inputs, keras.layers.Dense(4, name="token_head")(x), name="token_classifier")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x_train, y_train = token_data(1500, seed=1)
    model.fit(x_train.astype(np.int32), y_train, epochs=10, batch_size=32, verbose=0)
    path = tmp_path / "tokens.keras"
    model.save(path)
    source = open_source(str(path))
    calibration, _ = token_data(64, seed=2)
    tokens, labels = token_data(200, seed=3)
    table = np.asarray(model.get_layer("embed").embeddings)

    def gather_error(artifact: Path) -> tuple[float, float]:
        """Max error of the GATHER output against the float table's rows, and the artifact's accuracy."""
        interpreter = keras_free_interpreter(artifact)
        (gather,) = [op for op in interpreter._get_ops_details() if op["op_name"] == "GATHER"]
        detail = interpreter._get_tensor_details(gather["outputs"][0], subgraph_index=0)
        (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
        worst, right = 0.0, 0
        for row, label in zip(tokens, labels):
            interpreter.set_tensor(inp["index"], row[None].astype(inp["dtype"]))
            interpreter.invoke()
            value = interpreter.get_tensor(gather["outputs"][0]).astype(np.float64)
            scale, zero = detail["quantization"]
            if detail["dtype"] != np.float32:
                value = (value - zero) * scale
            worst = max(worst, float(np.max(np.abs(value[0] - table[row]))))
            right += int(np.argmax(interpreter.get_tensor(out["index"])) == label)
        return worst, right / len(labels)

    def keras_free_interpreter(artifact: Path) -> Any:
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=str(artifact), experimental_preserve_all_tensors=True)
        interpreter.allocate_tensors()
        return interpreter

    start = time.perf_counter()
    ruled = tflite.convert(_token_request(source, tmp_path / "w", "tflite", calibration), tmp_path / "ruled.tflite")
    ruled_s = time.perf_counter() - start
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tflite, "_reads_integer_input", lambda model: False)  # the rule off
        start = time.perf_counter()
        plain = tflite.convert(_token_request(source, tmp_path / "w", "tflite", calibration), tmp_path / "plain.tflite")
        plain_s = time.perf_counter() - start
    float_acc = float(np.mean(np.argmax(model.predict(tokens.astype(np.int32), verbose=0), 1) == labels))
    (exact, ruled_acc), (rounded, plain_acc) = gather_error(ruled.path), gather_error(plain.path)
    print(f"tflite embedding max error: with the rule {exact} ({ruled_s:.1f}s, accuracy {ruled_acc:.3f}), "
          f"without {rounded:.3g} ({plain_s:.1f}s, accuracy {plain_acc:.3f}); float accuracy {float_acc:.3f}")
    assert exact == 0.0 and rounded > 0.0
    assert any("first op after the integer input" in note for note in ruled.notes), ruled.notes
    assert ruled.float_io == () and [t.dtype for t in inspect_tflite(ruled.path).outputs] == ["int8"]
    assert inspect_tflite(ruled.path).quantized_ops > 0  # the rest of the model is int8
    assert ruled.float_nodes and all("/embed_" in n for n in ruled.float_nodes), ruled.float_nodes
    assert ruled_acc >= float_acc - 0.02


# --------------------------------------------------------------------------------------------- LayerNorm/GELU


# Every layer of the models built here is named: Keras numbers unnamed layers per process, and the digits CNN of
# other tests (trained in-process) would otherwise get other layer names after these tests ran.


def test_tflite_layernorm_statistics_stay_float(digits, tmp_path) -> None:
    """A trained digits MLP with two LayerNormalization layers and GELUs: the LayerNorm decompositions' RSQRT and
    SQUARED_DIFFERENCE and the elementwise ops next to them stay float, recorded with the rule; the dense layers
    and the builtin GELU stay int8, and so do input and output. (On this small model plain INT8 keeps the
    accuracy too: the rule is measured here for what it keeps float and that it costs no accuracy.)"""
    import keras
    import numpy as np

    from tests.fixtures.tflite import digits_request
    from toolkit.runtimes.execution.tflite import TFLiteSession
    from toolkit.runtimes.inspection.tflite import inspect_tflite
    from toolkit.sources import open_source

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Dense(64, name="d1")(keras.layers.Flatten(name="ln_flat")(inputs))
    x = keras.layers.Activation("gelu", name="g1")(keras.layers.LayerNormalization(name="ln")(x))
    x = keras.layers.LayerNormalization(name="ln2")(keras.layers.Dense(64, activation="gelu", name="d2")(x))
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="layernorm_mlp")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(digits.x_train, digits.y_train, epochs=15, batch_size=32, verbose=0)
    model.save(tmp_path / "ln.keras")
    float_acc = float(np.mean(np.argmax(model.predict(digits.x_heldout, verbose=0), 1) == digits.y_heldout))
    request = digits_request(open_source(str(tmp_path / "ln.keras")), digits, tmp_path / "w", precision="int8",
                             io_dtype="int8")
    built = tflite.convert(request, tmp_path / "ln.tflite")
    session = TFLiteSession(built.path)
    try:
        predictions = [int(np.argmax(session.run({"image": x[None]})[0])) for x in digits.x_heldout]
    finally:
        session.close()
    accuracy = float(np.mean(np.array(predictions) == digits.y_heldout))
    print(f"layernorm model: float {float_acc:.3f}, int8 with the rule {accuracy:.3f}, "
          f"{len(built.float_nodes)} nodes float")
    (note,) = [n for n in built.notes if n.startswith("kept in float up front")]
    assert "RSQRT of a decomposed LayerNorm/GELU" in note and "SQUARED_DIFFERENCE" in note, note
    assert all("/ln_" in n or "/ln2_" in n for n in built.float_nodes), built.float_nodes
    assert len(built.float_nodes) >= 4
    info = inspect_tflite(built.path)
    assert [t.dtype for t in (*info.inputs, *info.outputs)] == ["int8", "int8"]
    assert info.quantized_ops > 0 and info.op_counts.get("GELU", 0) == 2
    assert accuracy >= float_acc - 0.01
