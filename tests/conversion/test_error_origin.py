"""A third party's exception keeps its origin: the reason names the exception's type and the module and
function that raised it (not only a bare message), and the exception stays chained for --debug's traceback.
Real failures only: onnxruntime refusing to run a model on a feed of the wrong rank, numpy's linear algebra
on a singular matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from toolkit.conversion import onnx_checks
from toolkit.errors import ConversionError, origin


def test_a_numpy_error_names_numpy() -> None:
    with pytest.raises(np.linalg.LinAlgError) as caught:
        np.linalg.inv(np.zeros((2, 2)))
    where = origin(caught.value)
    assert where is not None and where.startswith("numpy.linalg"), where
    error = onnx_checks.failure("Static int8 quantization (onnx int8) failed", caught.value)
    assert error.message.startswith("Static int8 quantization (onnx int8) failed: Singular matrix (LinAlgError "
                                    "raised in numpy.linalg"), error.message


def test_an_onnxruntime_run_failure_names_onnxruntime(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    runner = onnx_checks.session(path)
    with pytest.raises(Exception) as caught:
        runner.run(None, {"x": np.zeros((1, 4, 1), np.float32)})  # the wrong rank
    error = onnx_checks.failure("The artifact model fails to run in onnxruntime", caught.value)
    assert isinstance(error, ConversionError)
    assert "raised in onnxruntime." in error.message and "rank" in error.message.lower(), error.message


def test_the_toolkits_own_frames_are_not_an_origin() -> None:
    from toolkit.errors import UsageError
    from toolkit.model.roles import parse_role

    with pytest.raises(UsageError) as caught:
        parse_role("nope", where="--output-task x=nope")
    assert origin(caught.value) is not None and origin(caught.value).startswith("tests.")  # only this test's frame
    assert not origin(caught.value).startswith("toolkit")
