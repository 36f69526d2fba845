"""An INT8 ONNX that onnxruntime refuses to load or run gets the selective retry a TFLite crash gets: the node
onnxruntime names is mapped back to the source model's node and kept float (toolkit/conversion/runtime_retry.py),
and the crash guard's graph cuts and bisection (toolkit/conversion/graph_cuts.py) work on ONNX graphs too.

The refusals are real onnxruntime ones, on the trained digits CNN's INT8 ONNX as the toolkit's quantizer writes
it, edited before the build's own check loads it:

- the classifier Gemm's int8 weights get a uint8 zero point (the same value, the other signedness: what a
  quantizer that mixes U8 and S8 types writes). onnxruntime refuses to load the model: "Type parameter (T) of
  Optype (DequantizeLinear) bound to different types (tensor(int8) and tensor(uint8)) in node (..._Dequantize
  Linear)". The node it names is the weight's DequantizeLinear, not a node of the source model.
- the first Conv's output zero point gets the shape [1, 1] instead of a scalar (what onnxruntime 1.21 began
  refusing in real quantized models, onnxruntime issue 24518). The model loads; its first run fails inside the
  QLinearConv that onnxruntime's optimizer fused from DequantizeLinear-Conv-QuantizeLinear: "running
  QLinearConv node. Name:'..._token_1'", a name that is in neither the artifact nor the source.

Each edit is applied only where its node is quantized, so a rebuild with that node float has nothing to edit,
as a kernel bug on a quantized op would have nothing to fail on. No onnxruntime crash (a signal) was found for
a quantized node: about fifty edits of scales, zero points, attributes and initializers of this artifact, and
of the QLinearConv/QGemm/QLinearSoftmax nodes onnxruntime fuses it into (its optimized model saved and edited),
were all refused by onnxruntime 1.31's checks with an error; the crash path's ONNX cuts are tested on the real artifact below.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from toolkit.conversion.pipeline import ConvertOptions, convert_bundle

GEMM = "digits_1/dense_1_2/MatMul/MatMulAddFusion"  # the classifier, as tf2onnx names it
CONV = "digits_1/conv2d_1/BiasAdd"  # the first Conv


def _graph(model: Any) -> tuple[dict[str, Any], dict[str, list[Any]], dict[str, Any]]:
    """Producers and readers of each tensor, and the initializers, of an ONNX model (Any: onnx protos)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    readers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return producer, readers, {t.name: t for t in model.graph.initializer}


def _uint8_weight_zero_point(model: Any) -> bool:
    """The classifier Gemm's int8 weight zero point as uint8; False when its weights are float."""
    from onnx import numpy_helper

    producer, _, initializers = _graph(model)
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm" and n.name == GEMM)
    dequantize = producer.get(gemm.input[1])
    if dequantize is None or dequantize.op_type != "DequantizeLinear":
        return False
    zero_point = initializers[dequantize.input[2]]
    zero_point.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(zero_point).astype(np.uint8),
                                                zero_point.name))
    return True


def _matrix_output_zero_point(model: Any) -> bool:
    """The first Conv's output zero point as a [1, 1] tensor; False when that Conv runs float."""
    from onnx import numpy_helper

    producer, readers, initializers = _graph(model)
    conv = next(n for n in model.graph.node if n.op_type == "Conv" and n.name == CONV)
    if getattr(producer.get(conv.input[0]), "op_type", None) != "DequantizeLinear":
        return False
    quantize = next(n for n in readers[conv.output[0]] if n.op_type == "QuantizeLinear")
    zero_point = initializers[quantize.input[2]]
    zero_point.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(zero_point).reshape(1, 1), zero_point.name))
    return True


def test_an_int8_onnx_onnxruntime_refuses_is_retried_with_the_named_nodes_float(
        digits_onnx: Path, digits_calibration: Path, digits_eval: Path, tmp_path: Path) -> None:
    import onnx

    from toolkit.conversion import candidate
    from toolkit.conversion.onnx import quant as onnx_quant

    real = onnx_quant.static_int8
    planted: list[str] = []

    def static_int8(request: Any, base: Any, tmp: Path) -> Any:
        result = real(request, base, tmp)
        model = onnx.load(str(tmp))
        planted.extend(name for name, edit in (("load", _uint8_weight_zero_point), ("run", _matrix_output_zero_point))
                       if edit(model))
        onnx.save(model, str(tmp))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnx_quant, "static_int8", static_int8)
        patch.setattr(candidate, "is_this_host", lambda name: False)  # timings of an 8x8 net: no speed verdict
        manifest = convert_bundle(ConvertOptions(
            source=str(digits_onnx), target="generic-x86_64", calibration=digits_calibration,
            eval_data=digits_eval, formats=("onnx",), out=tmp_path / "bundle", use_cache=False),
            progress=lambda message: None).manifest
    assert planted[:2] == ["load", "run"], planted  # the first build had both nodes quantized
    failed = [a for a in manifest.attempts if a.recipe.precision == "int8" and a.outcome == "failed"]
    reasons = [a.reason for a in failed]
    assert len(failed) == 2, reasons
    assert "bound to different types" in reasons[0], reasons  # a load refusal naming the weight's DequantizeLinear
    assert "in node (digits_1/dense_1_2/Cast/ReadVariableOp:0_DequantizeLinear)" in reasons[0], reasons
    assert "QLinearConv node. Name:'digits_1/conv2d_1/BiasAdd_token_" in reasons[1], reasons
    int8 = next((a for a in manifest.artifacts if a.file == "model.int8.onnx"), None)
    assert int8 is not None, [(a.recipe.nodes_to_exclude, a.outcome, a.reason) for a in manifest.attempts]
    assert int8.recipe.nodes_to_exclude == (GEMM, CONV) and int8.status == "ok", (int8.status, int8.recipe)
    assert any(n.startswith(f"{GEMM}, {CONV} kept float: runtime retry") for n in int8.notes), "\n".join(int8.notes)
    fp32 = manifest.artifact("model.fp32.onnx")
    assert int8.verification is not None and fp32.verification is not None
    assert int8.verification.accuracy is not None and fp32.verification.accuracy is not None
    assert int8.verification.accuracy >= fp32.verification.accuracy - 0.02, (int8.verification, fp32.verification)


@pytest.fixture(scope="module")
def digits_int8_onnx(digits_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits CNN's INT8 ONNX as the toolkit builds it (prepared, then onnxruntime's static quantizer)."""
    from tests.fixtures.models import load_digits
    from toolkit.conversion.onnx import prepare as onnx_prepare
    from toolkit.conversion.onnx import quant as onnx_quant
    from toolkit.conversion.base import ConversionRequest
    from toolkit.model.recipe import Recipe
    from toolkit.sources.onnx import OnnxSource

    work = tmp_path_factory.mktemp("onnx_cuts")
    source = OnnxSource(digits_onnx)
    calibration = tuple({"image": x[None]} for x in load_digits().x_calib[:64])

    def request(precision: str) -> ConversionRequest:
        return ConversionRequest(source=source, recipe=Recipe("onnx", precision), input_shapes={"image": (1, 8, 8, 1)},
                                 calibration=calibration, workdir=work)

    base = onnx_prepare.prepare(request("fp32"), work / "export.fp32.onnx")
    return onnx_quant.derive(request("int8"), base, work / "digits.int8.onnx").path


def test_every_onnx_cut_runs_and_gives_the_full_models_tensors(digits_int8_onnx: Path) -> None:
    """Cut k of the real INT8 graph computes exactly what the whole graph computes at its k-th node."""
    import onnx
    import onnxruntime as ort

    from toolkit.conversion.onnx.artifact import cuts

    graph = cuts(digits_int8_onnx)
    model = onnx.load(str(digits_int8_onnx))
    assert graph is not None and graph.count == len(model.graph.node) > 20
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the nodes as written
    wanted = [name for node in model.graph.node for name in node.output if name]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in wanted)
    image = np.random.default_rng(0).random((1, 8, 8, 1), dtype=np.float32)
    whole = dict(zip(wanted, ort.InferenceSession(model.SerializeToString(), options).run(wanted, {"image": image})))
    for k in range(1, graph.count + 1):
        node = model.graph.node[k - 1]
        assert graph.name(k) == f"{node.op_type} node. Name:'{node.name}'"
        got = ort.InferenceSession(graph.cut(k), options).run(None, {"image": image})
        for name, value in zip([n for n in node.output if n], got):
            np.testing.assert_array_equal(value, whole[name], err_msg=f"cut {k} ({node.name})")


def test_bisecting_onnx_cuts_finds_the_node_a_real_refusal_sits_in(digits_int8_onnx: Path, tmp_path: Path) -> None:
    """The bisection the crash guard runs, over ONNX cuts, each run in the crash guard's child; here the child
    fails with onnxruntime's refusal of the [1, 1] zero point rather than a signal: the same search."""
    import onnx

    from toolkit.conversion.graph_cuts import first_failing
    from toolkit.conversion.onnx.artifact import cuts, source_nodes as onnx_source_nodes

    model = onnx.load(str(digits_int8_onnx))
    assert _matrix_output_zero_point(model)
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, image=np.random.default_rng(0).random((1, 8, 8, 1), dtype=np.float32))
    graph = cuts(broken)
    assert graph is not None
    cut, tried = tmp_path / "cut.onnx", []

    def fails(k: int) -> bool:
        tried.append(k)
        cut.write_bytes(graph.cut(k))
        done = subprocess.run([sys.executable, "-m", "toolkit.runtimes.execution.first_run", str(cut), str(feeds)],
                              capture_output=True, check=False)
        return done.returncode != 0

    found = first_failing(graph.count, fails)
    names = [n.name for n in model.graph.node]
    quantize = names.index("digits_1/conv2d_1/Relu:0_QuantizeLinear")  # the first node that reads the zero point
    assert found == quantize + 1, (found, names[found - 1] if found else None, tried)
    assert len(tried) <= graph.count.bit_length() + 1, tried  # bisection, not a scan
    assert graph.name(found) == "QuantizeLinear node. Name:'digits_1/conv2d_1/Relu:0_QuantizeLinear'"
    assert CONV in onnx_source_nodes(broken, ["digits_1/conv2d_1/Relu:0_QuantizeLinear"])
    assert onnx_source_nodes(None, [f"{CONV}_token_1"]) == [CONV]


@pytest.mark.parametrize(("message", "node"), [
    # onnxruntime 1.31's own words on edited INT8 digits artifacts (load, then run)
    ("Load model from m.onnx failed:Node (digits_1/dense_1_2/MatMul/MatMulAddFusion) Op (Gemm) "
     "[ShapeInferenceError] Dimension mismatch in unification between 200 and 256", GEMM),
    ("Load model from m.onnx failed:Type Error: Type parameter (T) of Optype (DequantizeLinear) bound to different "
     "types (tensor(int8) and tensor(uint8) in node (w:0_DequantizeLinear).", "w:0_DequantizeLinear"),
    ('Load model from m.onnx failed:This is an invalid model. In Node, ("digits_1/dense_1_2/MatMul/MatMulAddFusion", '
     'QGemm, "com.microsoft", -1) : ("x": tensor(uint8),', GEMM),
    ("Non-zero status code returned while running QLinearConv node. Name:'digits_1/conv2d_1/BiasAdd_token_1' "
     "Status Message: qlinearconv.cc:77 IsScalarOr1ElementVector(Y_zero_point) was false.", CONV),
])
def test_onnxruntime_messages_name_the_source_node(message: str, node: str) -> None:
    from toolkit.conversion.onnx.artifact import named_nodes as onnx_named_nodes, source_nodes as onnx_source_nodes

    assert onnx_source_nodes(None, onnx_named_nodes(message)) == [node]
