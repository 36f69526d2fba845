"""INT8 on models with integer inputs: token ids stay int64 from the calibration data to the golden data.

The token classifier is trained (tests/fixtures/token_models.py), so agreement with the float model is a
real claim about this small model, not about transformers in general.
"""

from __future__ import annotations

import numpy as np
from tests.fixtures.token_models import TokenModel, token_net  # noqa: F401 (fixture)
from toolkit.delivery.bundle import GOLDEN_INPUTS, load_npz, read_bundle
from toolkit.runtimes.inspection import inspect_model
from toolkit.conversion.pipeline import ConvertOptions, ConvertResult, convert_bundle


def _convert(source: str, model: TokenModel, out, **options) -> ConvertResult:
    return convert_bundle(
        ConvertOptions(source=source, calibration=model.calibration, eval_data=model.eval_data, out=out,
                       use_cache=False, **options),
        progress=lambda message: None,
    )


def test_onnx_static_int8_with_int64_tokens(token_net: TokenModel, tmp_path) -> None:
    result = _convert(str(token_net.onnx), token_net, tmp_path / "b")
    manifest = result.manifest
    int8 = manifest.artifact("model.int8.onnx")
    assert [(s.name, s.dtype) for s in int8.inputs] == [("tokens", "int64")]
    assert inspect_model(result.bundle_dir / int8.file).quantized_ops > 0
    golden = load_npz(result.bundle_dir / GOLDEN_INPUTS)
    assert all(v.dtype == np.int64 for v in golden.values())
    assert int8.verification is not None and int8.verification.top1_agreement is not None
    assert int8.verification.top1_agreement >= 0.97
    read_bundle(result.bundle_dir)


def test_pytorch_embedding_int8_to_tflite_and_onnx(token_net: TokenModel, tmp_path) -> None:
    """The eager module records no dtype: int64 data make the input int64; PT2E calibrates the embedding on
    integers, the TFLite artifact takes int32 tokens and the manifest says so (the runner casts)."""
    result = convert_bundle(
        ConvertOptions(source=token_net.factory, weights=token_net.weights, calibration=token_net.calibration,
                       eval_data=token_net.eval_data, precisions=("int8",), formats=("tflite", "onnx"),
                       input_shapes={"tokens": (1, 8)}, out=tmp_path / "b", use_cache=False),
        progress=lambda message: None,
    )
    manifest = result.manifest
    tflite, onnx = manifest.artifact("model.int8.tflite"), manifest.artifact("model.int8.onnx")
    for record in (tflite, onnx):
        assert record.verification is not None and record.verification.top1_agreement is not None
        assert record.verification.top1_agreement >= 0.97, record.file
        assert inspect_model(result.bundle_dir / record.file).quantized_ops > 0
    assert [s.dtype for s in onnx.inputs] == ["int64"]
    assert [s.dtype for s in tflite.inputs] == ["int32"]
    # the first op after the integer input (the embedding lookup) stays float: its rows come out exact
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(result.bundle_dir / tflite.file))
    details = {t["index"]: t for t in interpreter.get_tensor_details()}
    lookups = [op for op in interpreter._get_ops_details() if op["op_name"] in ("GATHER", "EMBEDDING_LOOKUP")]
    assert lookups, [op["op_name"] for op in interpreter._get_ops_details()]
    for op in lookups:  # EMBEDDING_LOOKUP(ids, table), GATHER(table, ids)
        table = details[op["inputs"][1 if op["op_name"] == "EMBEDDING_LOOKUP" else 0]]
        assert table["dtype"] == np.float32, (op["op_name"], table["name"], table["dtype"])
    assert "input 'tokens' is int32 in the artifact (int64 in the source)" in tflite.notes
    golden = load_npz(result.bundle_dir / GOLDEN_INPUTS)
    assert all(v.dtype == np.int64 for v in golden.values())
