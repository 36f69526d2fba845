"""An artifact that crashes its runtime does not take the convert run down: its first load and inference run in a
child process (toolkit/conversion/crash_guard.py), the crash is a failed attempt naming the signal and the op,
the runtime retry keeps that op in float, and the other artifacts are built as before. On the PyTorch -> TFLite
route the op a runtime names is mapped to the FX node it came from (toolkit/conversion/pt2e/tflite_fx.py).

The crash is real: the trained digits CNN's INT8 TFLite, as built, with the int8 RESHAPE that flattens the
features edited to read "no tensor" (-1) as its shape. LiteRT's RESHAPE kernel then dereferences a tensor that
is not there and the process dies of SIGSEGV while preparing the model (ai-edge-litert 2.3, with or without
XNNPACK). The edit stands in for a converter or kernel bug; the interpreter, the crash and the retry are the
real ones. Without the guard this test's own process dies. The PyTorch case is LiteRT's own refusal of an INT8
artifact with an edited bias (below).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.fixtures.torch_models import TorchModel

from toolkit.conversion.pipeline import ConvertOptions, convert_bundle
from toolkit.model.vocabulary import Format, Precision


def _drop_int8_reshape_shape(path: Path) -> bool:
    """Point the RESHAPE that flattens int8 data (2-D output) at no shape tensor; False when there is none."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as fb

    model = fb.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    graph = model.subgraphs[0]
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if (max(code.builtinCode, code.deprecatedBuiltinCode) == fb.BuiltinOperator.RESHAPE
                and len(op.inputs) > 1 and graph.tensors[op.inputs[0]].type == fb.TensorType.INT8
                and len(graph.tensors[op.outputs[0]].shape) == 2):
            op.inputs = [int(op.inputs[0]), -1, *(int(t) for t in op.inputs[2:])]
            builder = flatbuffers.Builder(1024)
            builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
            path.write_bytes(bytes(builder.Output()))
            return True
    return False


def _int8_bias_on_the_int8_classifier(path: Path) -> bool:
    """Give the FULLY_CONNECTED with int8 weights for the 10 classes its own int8 input as bias; False when
    there is none (its weights are float)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as fb

    model = fb.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    graph = model.subgraphs[0]
    dense = [op for op in graph.operators
             if max(model.operatorCodes[op.opcodeIndex].builtinCode,
                    model.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode) == fb.BuiltinOperator.FULLY_CONNECTED
             and graph.tensors[op.inputs[1]].type == fb.TensorType.INT8 and graph.tensors[op.inputs[1]].shape[0] == 10]
    if not dense:
        return False
    op = dense[-1]
    op.inputs = [int(op.inputs[0]), int(op.inputs[1]), int(op.inputs[0])]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path.write_bytes(bytes(builder.Output()))
    return True


def test_fx_nodes_follow_the_op_order_where_the_counts_match_else_take_the_family() -> None:
    """The PyTorch digits net as litert-torch writes it: a layout RESHAPE of its own, then torch's flatten."""
    from toolkit.conversion.pt2e.tflite_fx import fx_nodes

    ops = ["RESHAPE", "DEPTHWISE_CONV_2D", "CONV_2D", "MAX_POOL_2D", "TRANSPOSE", "RESHAPE", "FULLY_CONNECTED",
           "FULLY_CONNECTED"]
    graph = [("conv2d", "conv2d"), ("relu", "relu"), ("conv2d_1", "conv2d"), ("relu_1", "relu"),
             ("max_pool2d", "max_pool2d"), ("flatten", "flatten"), ("linear", "linear"), ("relu_2", "relu"),
             ("linear_1", "linear")]
    assert fx_nodes(ops, graph, [("FULLY_CONNECTED", 7)]) == ("linear_1",)
    assert fx_nodes(ops, graph, [("CONV_2D", 2)]) == ("conv2d_1",)  # depthwise and plain: one family, in order
    assert fx_nodes(ops, graph, [("RESHAPE", 5)]) == ("flatten",)  # 2 RESHAPEs for 1 flatten: the family
    assert fx_nodes(ops, graph, [("FULLY_CONNECTED", None)]) == ("linear", "linear_1")  # "version 9 (...)"
    assert fx_nodes(ops, graph, [("GATHER", 3)]) == ()


def _convert_planted(options: ConvertOptions, plant: Callable[[Path], bool]) -> tuple[Any, list[str]]:
    """``options`` converted with ``plant`` applied to every INT8 TFLite as built (the labels it changed)."""
    from toolkit.conversion import candidate, registry

    real_build = registry.build
    planted: list[str] = []

    def build(request: Any, output: Path) -> Any:
        built = real_build(request, output)
        recipe = request.recipe
        if recipe.format == Format.TFLITE and recipe.precision == Precision.INT8:
            if plant(built.path):
                planted.append(recipe.label)
        return built

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "build", build)
        patch.setattr(candidate, "is_this_host", lambda name: False)  # timings of an 8x8 net: no speed verdict
        return convert_bundle(options, progress=lambda message: None), planted


def test_a_crashing_int8_tflite_is_a_failed_attempt_and_is_retried_with_the_op_float(
        digits_keras: Path, digits_calibration: Path, digits_eval: Path, tmp_path: Path) -> None:
    result, planted = _convert_planted(ConvertOptions(
        source=str(digits_keras), target="generic-x86_64", calibration=digits_calibration, eval_data=digits_eval,
        formats=("tflite",), out=tmp_path / "bundle", use_cache=False), _drop_int8_reshape_shape)
    manifest = result.manifest
    assert planted, "no int8 RESHAPE to break: the test proves nothing"
    crashed = [a for a in manifest.attempts if "crashed the interpreter" in a.reason]
    assert crashed, [a.reason for a in manifest.attempts]
    reason = crashed[0].reason
    assert reason.startswith("the int8 TFLite crashed the interpreter while loading it (SIGSEGV)"), reason
    assert "Node number 3 (RESHAPE)" in reason, reason  # conv, conv, pool, then the reshape
    int8 = manifest.artifact("model.int8.tflite")
    assert "RESHAPE" in int8.recipe.nodes_to_exclude and int8.status == "ok", (int8.status, int8.recipe)
    assert any(n.startswith("RESHAPE kept float: runtime retry") for n in int8.notes), int8.notes
    assert manifest.artifact("model.fp32.tflite").status == "ok"  # the run went on with the other artifacts


@pytest.mark.skipif(
    importlib.util.find_spec("litert_torch") is None,
    reason="litert-torch is not installed: pip install -e '.[litert-torch]' (CI gets it through '.[all]')")
def test_a_pt2e_int8_tflite_the_runtime_refuses_is_retried_with_its_fx_node_float(
        torch_digits_net: TorchModel, tmp_path: Path) -> None:
    """The PyTorch digits net's PT2E INT8 TFLite with its classifier (fc2) given an int8 bias: LiteRT refuses
    it ("Node number 7 (FULLY_CONNECTED) failed to prepare"). The artifact holds two FULLY_CONNECTED ops and the
    FX graph two ``linear`` nodes, so node 7 is the second, ``linear_1`` (fc2): only it is kept float."""
    model = torch_digits_net
    calibration, eval_data = tmp_path / "calib.npz", tmp_path / "eval.npz"
    np.savez(calibration, image=model.x_calib)
    np.savez(eval_data, image=model.x_heldout, y=model.y_heldout)
    result, planted = _convert_planted(ConvertOptions(
        source=model.factory, weights=model.weights, target="generic-x86_64", calibration=calibration,
        eval_data=eval_data, input_shapes={"image": model.input_shape}, formats=("tflite",),
        out=tmp_path / "bundle", use_cache=False), _int8_bias_on_the_int8_classifier)
    manifest = result.manifest
    assert planted, "no int8 FULLY_CONNECTED to break: the test proves nothing"
    failed = [a for a in manifest.attempts if a.recipe.precision == "int8" and a.outcome == "failed"]
    assert failed and "Node number 7 (FULLY_CONNECTED)" in failed[0].reason, [a.reason for a in manifest.attempts]
    int8 = next((a for a in manifest.artifacts if a.file == "model.int8.tflite"), None)
    assert int8 is not None, [(a.recipe.nodes_to_exclude, a.reason) for a in manifest.attempts]
    assert int8.recipe.nodes_to_exclude == ("linear_1",) and int8.status == "ok", (int8.status, int8.recipe)
    assert any(n.startswith("linear_1 kept float: runtime retry") for n in int8.notes), int8.notes
    assert int8.verification is not None and int8.verification.accuracy is not None
    assert int8.verification.accuracy >= model.float_accuracy - 0.02, (int8.verification.accuracy, model)
