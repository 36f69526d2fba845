"""A third party's exception keeps its origin: the reason names the exception's type and the module and
function that raised it (not only a bare message), and the exception stays chained for --debug's traceback.
Real failures only: onnxruntime refusing to run a model on a feed of the wrong rank, numpy's linear algebra
on a singular matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from toolkit.conversion.onnx import checks as onnx_checks
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


def test_an_exception_in_the_verification_child_keeps_its_origin_stage_and_traceback(tmp_path: Path) -> None:
    """A candidate's runs happen in a child process (crash_guard.measure): the exception onnxruntime raises there
    (a held-out sample of the wrong rank, from the second sample on) comes back with its type, the module and
    function that raised it, the stage, and its traceback for --debug."""
    import onnx
    from onnx import TensorProto, helper

    from toolkit.conversion import crash_guard
    from toolkit.conversion.measure_child import MeasureJob, RunFailed, RunProblem, write_feeds
    from toolkit.model.tensors import TensorSpec
    from toolkit.conversion.backend import backend_for
    from toolkit.model.vocabulary import Format, Framework

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    feeds = [{"x": np.zeros((1, 4), np.float32)}, {"x": np.zeros((1, 4, 1), np.float32)}]
    job = MeasureJob(path, 1, None, (TensorSpec("x", (1, 4), "float32"),), (TensorSpec("y", (1, 4), "float32"),),
                     write_feeds(feeds, tmp_path / "feeds.pkl"), None, None, False, ("x",))
    result = crash_guard.measure(job, backend=backend_for(Framework.KERAS, Format.ONNX), scratch=tmp_path)
    assert isinstance(result, RunFailed) and result.problem is RunProblem.RUN, result
    reason = result.reason()
    assert reason.startswith("the artifact does not run in its runtime: "), reason
    assert "(InvalidArgument raised in onnxruntime." in reason and "while verifying it on held-out sample 1)" in reason
    assert "Traceback (most recent call last)" in result.traceback and "measure_child.py" in result.traceback
