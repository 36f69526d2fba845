"""inspect_onnx: op counts including If subgraphs, quantized compute nodes counted in every form the
onnxruntime quantizer writes (QDQ, QOperator, dynamic), precision guesses, and non-ONNX input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.ppocr import build_conv_net
from toolkit.errors import UsageError
from toolkit.runtimes.inspection import inspect_model
from toolkit.runtimes.inspection.onnx import inspect_onnx


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The conv net (with an If node) as fp32, static QDQ, static QOperator and dynamic, straight from
    onnxruntime.quantization (not through the toolkit, so the counting is checked independently)."""
    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    root = tmp_path_factory.mktemp("inspect")
    fp32 = build_conv_net(root / "fp32.onnx", with_if=True)
    plain = build_conv_net(root / "plain.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.items = iter([{"x": rng.random((1, 3, 16, 16), dtype=np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.items, None)

    paths = {"fp32": fp32, "plain": plain}
    for name, fmt in (("qdq", QuantFormat.QDQ), ("qop", QuantFormat.QOperator)):
        paths[name] = root / f"{name}.onnx"
        quantize_static(str(plain), str(paths[name]), Reader(), quant_format=fmt, per_channel=True)
    paths["dynamic"] = root / "dynamic.onnx"
    quantize_dynamic(str(plain), str(paths["dynamic"]))
    return paths


def test_fp32_counts_include_subgraphs(quantized: dict[str, Path]) -> None:
    info = inspect_model(quantized["fp32"])
    # 2 Convs in the main graph, one in each If branch
    assert info.op_counts["Conv"] == 4 and info.op_counts["Mul"] == 2 and info.op_counts["If"] == 1
    assert info.extra["subgraphs"] == 2
    assert info.float_compute_ops == 5  # 4 Conv + 1 Gemm
    assert info.quantized_ops == 0 and info.precision == "fp32" and info.opset == 17
    assert info.inputs[0].shape == (None, 3, 16, 16)
    assert [o.name for o in info.outputs] == ["logits", "side"]
    assert info.bytes == quantized["fp32"].stat().st_size
    assert info.to_dict()["op_counts"]["Conv"] == 4


def test_static_qdq(quantized: dict[str, Path]) -> None:
    info = inspect_onnx(quantized["qdq"])
    assert info.precision == "int8" and info.extra["quant_format"] == "qdq"
    assert info.float_compute_ops == 0
    # conv1, conv2, fc (+ the QDQ-wrapped pool / flatten that onnxruntime also runs in integer)
    assert info.quantized_ops >= 3
    assert info.op_counts["DequantizeLinear"] > info.op_counts["QuantizeLinear"] > 0


def test_static_qoperator(quantized: dict[str, Path]) -> None:
    info = inspect_onnx(quantized["qop"])
    assert info.precision == "int8" and info.extra["quant_format"] == "qoperator"
    assert info.op_counts["QLinearConv"] == 2
    assert info.quantized_ops >= 3 and info.float_compute_ops == 0


def test_dynamic(quantized: dict[str, Path]) -> None:
    info = inspect_onnx(quantized["dynamic"])
    assert info.precision == "dynamic"
    assert info.op_counts.get("ConvInteger", 0) == 2
    assert info.quantized_ops >= 3


def test_fp16(tmp_path: Path, quantized: dict[str, Path]) -> None:
    import onnx
    from onnxconverter_common import float16

    half = float16.convert_float_to_float16(onnx.load(str(quantized["plain"])), keep_io_types=True)
    path = tmp_path / "fp16.onnx"
    onnx.save(half, str(path))
    info = inspect_onnx(path)
    assert info.precision == "fp16" and info.quantized_ops == 0
    assert info.inputs[0].dtype == "float32"


def test_non_onnx_file_is_a_usage_error(tmp_path: Path) -> None:
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"\x00\x01garbage" * 100)
    with pytest.raises(UsageError):
        inspect_onnx(fake)
