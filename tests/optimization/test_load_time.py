"""Load time (issue 8): offline ONNX graph optimizations, the ORT format, external data and TFLite memory
mapping, each produced from a real converted digits artifact and measured cold by the real runner in the
device env (numpy + onnxruntime + ai-edge-litert, no toolkit), which also checks the variant's outputs
against the original model's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.cli import assert_clean_error
from toolkit.errors import UsageError
from toolkit.optimization.load_time import (
    RUNNER,
    _bundle_for,
    _reference,
    load_time_report,
)
from toolkit.optimization.onnx_variants import optimize_onnx
from tests.fixtures.runner_output import report_doc


@pytest.fixture(scope="module")
def digits_artifacts(digits_torch, digits_keras, tmp_path_factory) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    """fp32 artifacts of the digits CNNs, built the cheapest real way: the PyTorch CNN exported to ONNX
    (torch.onnx), the Keras CNN converted to TFLite (TFLiteConverter)."""
    import keras
    import torch

    from tests.fixtures.bundles import _tflite_bytes

    out = tmp_path_factory.mktemp("load_time_artifacts")
    module = torch.jit.load(str(digits_torch.torchscript))
    onnx_path = out / "model.fp32.onnx"
    example = torch.from_numpy(np.load(digits_torch.eval)["x"][:1])
    torch.onnx.export(module, (example,), str(onnx_path), dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["logits"])
    tflite_path = out / "model.fp32.tflite"
    tflite_path.write_bytes(_tflite_bytes(keras.saving.load_model(digits_keras), "tflite-fp32", np.zeros(0)))
    return {"onnx": onnx_path, "tflite": tflite_path}


def test_onnx_variants_load_in_the_device_env_with_the_same_outputs(digits_artifacts, device_env, tmp_path):  # type: ignore[no-untyped-def]
    report = load_time_report(digits_artifacts["onnx"], out_dir=tmp_path, python=str(device_env.python), repeats=1)
    variants = [r.variant for r in report.rows]
    assert variants == ["as built", "offline basic", "offline extended", "ORT format (extended)", "external data"]
    for row in report.rows:
        assert row.outputs_match is True, row
        assert row.max_abs_error is not None and row.max_abs_error < 1e-4
        assert row.load_ms > 0 and row.first_inference_ms > 0 and row.latency_ms > 0
    assert (tmp_path / "model.fp32.extended.onnx").is_file() and (tmp_path / "model.fp32.ort").is_file()
    assert (tmp_path / "model.fp32.external.onnx.data").is_file()
    # the ORT file really is the flatbuffer format (file identifier ORTM at offset 4), not a renamed protobuf
    assert (tmp_path / "model.fp32.ort").read_bytes()[4:8] == b"ORTM"
    doc = report.to_dict()
    assert doc["rows"][0]["load_ratio"] == 1.0 and all(r["cold_start_ms"] > 0 for r in doc["rows"])
    print("\n" + report.table())


def test_offline_extended_graph_has_fewer_nodes(digits_artifacts, tmp_path):  # type: ignore[no-untyped-def]
    import onnx

    original = onnx.load(str(digits_artifacts["onnx"]))
    optimized = onnx.load(str(optimize_onnx(digits_artifacts["onnx"], tmp_path / "x.onnx", level="extended")))
    assert len(optimized.graph.node) < len(original.graph.node)
    # fused ops keep the model portable: nothing from the hardware-specific NCHWc layout pass
    assert not any(n.op_type.startswith("Reorder") or "Nchwc" in n.op_type for n in optimized.graph.node)
    assert not list(tmp_path.glob(".*partial*"))


def test_level_all_refused_with_the_reason(digits_artifacts, tmp_path):  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError) as info:
        optimize_onnx(digits_artifacts["onnx"], tmp_path / "x.onnx", level="all")
    assert "not portable" in (info.value.hint or "")
    assert not (tmp_path / "x.onnx").exists()


def test_tflite_is_loaded_from_a_path_and_memory_mapped(digits_artifacts, device_env, tmp_path):  # type: ignore[no-untyped-def]
    report = load_time_report(digits_artifacts["tflite"], out_dir=tmp_path, python=str(device_env.python),
                              repeats=2)
    runner_row, by_path, by_bytes = report.rows
    assert runner_row.outputs_match is True
    assert by_path.variant.endswith("(mmap)") and by_bytes.variant.endswith("bytes")
    # the runner loads from model_path (the interpreter mmaps it), never from bytes read into Python
    source = RUNNER.read_text()
    assert "interpreter_cls(model_path=path" in source and "model_content" not in source
    # while the runner holds the interpreter, the artifact is mapped into its memory
    bundle = _bundle_for(digits_artifacts["tflite"], tmp_path / "b", _reference(digits_artifacts["tflite"]), 1e-4)
    artifact = bundle / digits_artifacts["tflite"].name
    probe = (
        f"import runpy; r = runpy.run_path({str(RUNNER)!r}); "
        f"m = r['open_model']({str(artifact)!r}, 'tflite', {{}}, 1, None); "
        f"print(any({artifact.name!r} in line for line in open('/proc/self/maps')))"
    )
    out = subprocess.run([str(device_env.python), "-c", probe], capture_output=True, text=True, check=False,
                         timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr[-800:]


def test_runner_cold_flag_reports_load_and_first_inference(digits_artifacts, device_env, tmp_path):  # type: ignore[no-untyped-def]
    bundle = _bundle_for(digits_artifacts["onnx"], tmp_path / "b", _reference(digits_artifacts["onnx"]), 1e-4)
    out = subprocess.run([str(device_env.python), str(RUNNER), "check", "--bundle", str(bundle), "--runs", "3",
                          "--cold"], capture_output=True, text=True, check=False, timeout=120)
    doc = report_doc(out.stdout)
    assert doc["ok"] is True, doc
    (report,) = doc["reports"]
    assert report["load_ms"] > 0 and report["first_inference_ms"] > 0 and report["import_ms"] >= 0


def test_cli_load_time_json(edgetk, digits_artifacts, device_env, tmp_path):  # type: ignore[no-untyped-def]
    result = edgetk("optimize", digits_artifacts["onnx"], "--load-time", "--device-python", device_env.python,
                    "--repeats", "1", "--out", tmp_path / "lt", "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    assert [r["variant"] for r in doc["rows"]][:3] == ["as built", "offline basic", "offline extended"]
    assert all(r["outputs_match"] for r in doc["rows"])
    assert all(np.isfinite(r["load_ratio"]) for r in doc["rows"])


def test_cli_load_time_bad_input(edgetk_inproc, digits_keras, digits_artifacts, tmp_path):  # type: ignore[no-untyped-def]
    assert_clean_error(edgetk_inproc("optimize", digits_keras, "--load-time", "--out", tmp_path / "o"), 2,
                       ".onnx and .tflite")
    assert_clean_error(edgetk_inproc("optimize", digits_artifacts["onnx"], "--load-time", "--prune", "0.5",
                                     "--out", tmp_path / "o"), 2, "does not combine")
    assert_clean_error(edgetk_inproc("optimize", tmp_path / "none.onnx", "--load-time", "--out", tmp_path / "o"),
                       2, "does not exist")
