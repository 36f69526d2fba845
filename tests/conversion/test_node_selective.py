"""Selective quantization over nodes, on a spectral front end before a ``Log`` (tests/fixtures/spectral_models.py,
trained here): frames -> |DFT|^2 by a constant cos/sin basis -> Log -> a small CNN -> three quality scores.

The real quantizer (onnxruntime's ``quantize_static``, QDQ) rounds the power spectrum to 8 bits over the
tone's peak: the weak bins, where the noise level (the background score) lives, become zero and the Log
turns that into the model's largest error. The plain INT8 fails its decoded metric (each score's RMS error
against its spread); the node-level retry keeps the front end float (inputs up to and including the Log) and
the convolutions quantized, and passes; a copy of that artifact with its head planted broken is refused by
the same metric. With a tolerance no INT8 meets, the retry stops as soon as the locator's measurement says
no float set can pass, and says why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.spectral_models import SpectralModel, spectral_regressor  # noqa: F401 - fixture
from toolkit import api
from toolkit.conversion.retry_worth import weigh
from toolkit.model.tolerance import Tolerance
from toolkit.verification.outputs import verify_outputs

FRONT_END = {"/MatMul", "/MatMul_1", "/Mul", "/Mul_1", "/Add", "/Add_1", "/Log"}  # torch.onnx's node names


def _convert(model: SpectralModel, out: Path, **options: Any) -> dict[str, Any]:
    api.convert(model.model, out=out, formats=["onnx"], calibration=model.calibration, eval_data=model.eval,
                use_cache=False, progress=lambda message: None, **options)
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def bundle(spectral_regressor: SpectralModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("spectral") / "bundle"
    return out, _convert(spectral_regressor, out)


def _int8_attempts(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in manifest["attempts"] if a["recipe"]["precision"] == "int8"]


def _run(path: Path, frames: np.ndarray) -> list[list[np.ndarray]]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [[session.run(None, {"frames": frames[i:i + 1]})[0]] for i in range(len(frames))]


def test_plain_int8_fails_and_the_front_end_kept_float_passes(bundle: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = bundle
    plain, *retries = _int8_attempts(manifest)
    assert plain["recipe"]["nodes_to_exclude"] == [] and plain["outcome"] == "dropped", plain
    assert "scores (regression): worst component's RMS error against its spread" in plain["reason"], plain
    first = retries[0]  # the first float set tried is the front end, and it passes
    assert set(first["recipe"]["nodes_to_exclude"]) == FRONT_END and first["outcome"] == "kept", retries
    (record,) = [a for a in manifest["artifacts"] if a["precision"] == "int8"]
    assert FRONT_END <= set(record["float_nodes"]), record["float_nodes"]
    assert not any("Conv" in n or "Gemm" in n for n in record["float_nodes"])  # the head stays quantized
    out = record["verification"]["outputs"][0]
    assert out["role"] == "regression", out
    assert out["metrics"]["component_error_to_spread"] <= Tolerance().max_relative_error, out["metrics"]
    assert all(layer["why"].startswith("selective retry: front end kept float up to /Log")
               for layer in record["quantized"]["float_layers"]), record["quantized"]


def test_a_broken_head_on_the_kept_artifact_is_refused(spectral_regressor: SpectralModel,
                                                        bundle: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """The kept artifact's last Gemm reads its weights through a DequantizeLinear: its scale written 1000x too
    small, the artifact runs and its head collapses; the metric that kept the artifact refuses this copy."""
    import onnx
    from onnx import numpy_helper

    out, manifest = bundle
    (record,) = [a for a in manifest["artifacts"] if a["precision"] == "int8"]
    model = onnx.load(str(out / record["file"]))
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    gemm = [n for n in model.graph.node if n.op_type == "Gemm"][-1]
    weight = producer[gemm.input[1]]
    assert weight.op_type == "DequantizeLinear", weight.op_type  # the head is quantized
    scale = inits[weight.input[1]]
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 1e-3, scale.name))
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    reference = _run(spectral_regressor.model, spectral_regressor.x_eval)
    for path, refused in ((out / record["file"], False), (broken, True)):
        verdict = verify_outputs(reference, _run(path, spectral_regressor.x_eval), tolerance=Tolerance(),
                                 output_names=["scores"])
        assert any(f.startswith("scores (regression): worst component's RMS error against its spread")
                   for f in verdict.failures) is refused, (path.name, verdict.failures)


def test_the_retry_stops_where_no_float_set_can_pass(spectral_regressor: SpectralModel, tmp_path: Path) -> None:
    """A tolerance no INT8 artifact meets: the front end (which removes the located error) is rebuilt once, then
    the retry stops before the other float sets, naming the measurement."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "exact.toml").write_text('extends = "generic-x86_64"\n[tolerance]\nmin_cosine = 0.9999999\n'
                                         "max_relative_error = 0.00001\n")
    manifest = _convert(spectral_regressor, tmp_path / "bundle", target="exact", targets_dirs=[profiles])
    attempts = _int8_attempts(manifest)
    rebuilds = [a for a in attempts if a["recipe"]["nodes_to_exclude"]]
    assert len(rebuilds) <= 1 and all(a["outcome"] != "kept" for a in attempts), attempts
    (stop,) = [a for a in attempts if "; selective quantization stopped after" in a["reason"]]
    assert "not tried" in stop["reason"] and "of the measured error" in stop["reason"], stop["reason"]


def test_a_float_set_is_weighed_against_the_measured_errors() -> None:
    spread = {f"conv{i}": 0.05 for i in range(6)}
    assert not weigh(spread, ["conv0"]).worth  # leaves 91% of the error
    assert not weigh(spread, ["conv0", "conv1", "conv2", "conv3", "conv4"]).worth  # removes only its share
    assert "spread" in weigh(spread, ["conv0", "conv1", "conv2", "conv3", "conv4"]).why_not()
    lost = {**spread, "log": 2.0}
    assert weigh(lost, ["conv0", "log"]).worth and weigh(lost, ["log"]).remaining < 0.1
    assert weigh({}, ["log"]).worth  # nothing measured: no grounds to skip
