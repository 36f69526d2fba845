"""OnnxSession: a real onnxruntime CPU session behind the HostSession interface."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from toolkit.errors import UsageError
from toolkit.runtimes.execution import open_session
from toolkit.runtimes.execution.onnx import OnnxSession
from toolkit.sources.onnx import OnnxSource


def test_runs_like_the_source(conv_net_onnx: Path) -> None:
    session = open_session(conv_net_onnx, threads=1)
    assert isinstance(session, OnnxSession)
    assert session.runtime == "onnxruntime"
    assert [(s.name, s.shape, s.dtype) for s in session.inputs] == [("x", (None, 3, 16, 16), "float32")]
    assert [s.name for s in session.outputs] == ["logits"]
    x = np.random.default_rng(0).random((2, 3, 16, 16), dtype=np.float32)
    out = session.run({"x": x})
    assert out[0].dtype == np.float32 and out[0].shape == (2, 10)
    np.testing.assert_allclose(out[0], OnnxSource(conv_net_onnx).predict({"x": x})[0], atol=1e-5)


def test_threads_setting_reaches_the_session(conv_net_onnx: Path) -> None:
    """The session runs with the thread count asked for (equal outputs alone would pass if it were ignored),
    and gives the same numbers whatever the count."""
    x = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)
    outputs = []
    for threads in (1, 2):
        session = OnnxSession(conv_net_onnx, threads=threads)
        used = session._session.get_session_options()  # what onnxruntime itself was given
        assert (used.intra_op_num_threads, used.inter_op_num_threads) == (threads, 1)
        outputs.append(session.run({"x": x})[0])
    assert OnnxSession(conv_net_onnx)._session.get_session_options().intra_op_num_threads == 0  # ORT decides
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-5)


def test_broken_or_missing_file(tmp_path: Path, conv_net_onnx: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        OnnxSession(tmp_path / "absent.onnx")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(conv_net_onnx.read_bytes()[:1000])
    with pytest.raises(UsageError, match="cannot load broken.onnx"):
        OnnxSession(broken)
