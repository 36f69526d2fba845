"""Quantized in substance: each int8/dynamic artifact records the share of its weights and MACs computed in
integer (read from the file), a mostly-float one is labelled mixed everywhere, selective quantization tries the
cheapest layers first, and an INT8 artifact its runtime cannot load gets the selective retry.

Trained models only (tests/fixtures/share_models.py, the digits CNN): the accuracy figures are real."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.share_models import outlier_dense_keras, softplus_divide_keras  # noqa: F401 (fixtures)
from tests.fixtures.tflite import digits_request
from toolkit.conversion.pipeline import ConvertOptions, convert_bundle
from toolkit.model.quantized import QuantizedShare, precision_label
from toolkit.model.vocabulary import Format, Precision
from tests.fixtures.runner_output import report_doc


def _convert(source: Path, target: str, tmp_path: Path, digits_calibration: Path, digits_eval: Path, **extra):
    from toolkit.conversion import candidate

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(candidate, "is_this_host", lambda name: False)  # timings of an 8x8 net: no speed verdict
        return _convert_now(source, target, tmp_path, digits_calibration, digits_eval, **extra)


def _convert_now(source: Path, target: str, tmp_path: Path, digits_calibration: Path, digits_eval: Path, **extra):
    return convert_bundle(ConvertOptions(source=str(source), target=target, calibration=digits_calibration,
                                         eval_data=digits_eval, formats=("tflite",), out=tmp_path / "bundle",
                                         use_cache=False, **extra), progress=lambda message: None)


def test_selective_keeps_cheap_layers_first_and_labels_a_mostly_float_int8_mixed(
        outlier_dense_keras, digits_calibration, digits_eval, tmp_path):
    """Full INT8 loses this model (one outlier channel flattens the tensor the big dense layer reads). Before,
    the worst layer's group was kept float whatever its size: an "int8" TFLite holding 97% of its weights in
    float (0.99x the fp32 file), preferred. Now the cheap layers are tried first; only the set with the dense
    layer passes, so the artifact says so, is labelled mixed and does not end the format: the dynamic
    artifact (97% of its weights int8) is built and preferred."""
    from toolkit.reporting.report import convert_table
    from toolkit.reporting.terminal import bundle_rows

    result = _convert(outlier_dense_keras, "generic-aarch64", tmp_path, digits_calibration, digits_eval)
    manifest = result.manifest
    int8 = manifest.artifact("model.int8.tflite")
    share = int8.quantized
    assert share is not None and share.mixed and share.weights < 0.1, share
    top = share.float_layers[0]
    assert top.op == "FULLY_CONNECTED" and top.weights > 0.9 and top.why.startswith("selective retry"), top
    assert any("most of the model stays float" in n for n in int8.notes), int8.notes
    tries = [len(a.recipe.nodes_to_exclude) for a in manifest.attempts
             if a.recipe.precision == "int8" and a.recipe.nodes_to_exclude]
    assert tries[0] < tries[-1] and tries[-1] == len(int8.float_nodes), tries  # cheap sets tried before it
    dynamic = manifest.artifact("model.dynamic.tflite")
    assert dynamic.quantized is not None and dynamic.quantized.weights > 0.9 and not dynamic.quantized.mixed
    assert dynamic.preferred and not int8.preferred
    assert dynamic.bytes < 0.4 * manifest.artifact("model.fp32.tflite").bytes < int8.bytes
    # every table says mixed: the bundle table (terminal and HTML), the convert report, the JSON
    row = next(r for r in bundle_rows(manifest, []) if r[0] == "model.int8.tflite")
    assert row[1].startswith("int8 mixed: ") and row[1].endswith("% of weights int"), row
    assert "model.int8.tflite (int8 mixed" in convert_table(manifest, bundle_dir=result.bundle_dir)
    written = json.loads((result.bundle_dir / "manifest.json").read_text())
    entry = next(a for a in written["artifacts"] if a["file"] == "model.int8.tflite")
    assert entry["quantized"]["mixed"] is True and entry["quantized"]["float_layers"][0]["op"] == "FULLY_CONNECTED"


def test_runtime_retry_keeps_the_op_the_runtime_cannot_load_in_float(
        softplus_divide_keras, digits, digits_calibration, digits_eval, legacy_env, tmp_path):
    """A trained model whose softplus temperature divides the logits: full INT8 writes an int8 LOG (op version
    2) that tflite-runtime 2.14, raspberry-pi-4's runtime, cannot load, and an int8 DIV it loads but cannot run
    ("Div only supports FLOAT32, INT32 and quantized UINT8"). Before, the INT8 artifact was dropped, then shipped
    with LOG float and DIV int8, which failed on the device; now both are kept float, and the rebuild passes
    verification and runs in tflite-runtime 2.14 itself (the bundle's own runner, its golden check)."""
    from toolkit.runtimes.compat import tflite_incompatibilities

    result = _convert(softplus_divide_keras, "raspberry-pi-4", tmp_path, digits_calibration, digits_eval)
    manifest = result.manifest
    failed = [a for a in manifest.attempts if a.recipe.precision == "int8" and a.outcome == "failed"]
    assert failed and "LOG version 2" in failed[0].reason, [a.reason for a in manifest.attempts]
    assert "no int8 DIV kernel" in failed[0].reason, failed[0].reason
    int8 = manifest.artifact("model.int8.tflite")
    assert {"LOG", "DIV"} <= set(int8.recipe.nodes_to_exclude) and int8.status == "ok", (int8.status, int8.recipe)
    assert any(n.startswith("LOG, DIV kept float: runtime retry") for n in int8.notes), int8.notes
    assert tflite_incompatibilities(result.bundle_dir / int8.file, "tflite-runtime", "2.14") == []
    assert int8.verification is not None and int8.verification.accuracy is not None
    assert int8.verification.accuracy >= int8.verification.reference_accuracy - 0.01
    assert int8.quantized is not None and int8.quantized.weights == 1.0  # LOG and DIV hold no weights
    bundle = result.bundle_dir
    proc = subprocess.run([str(legacy_env.python), str(bundle / "edgetk_runner.py"), "check", "--bundle", str(bundle),
                           "--runs", "3", "--warmup", "1", "--artifact", int8.file],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (report,) = report_doc(proc.stdout)["reports"]
    assert report["runtime"]["version"].startswith("2.14") and report["error"] is None, report
    assert report["outputs_match"]["ok"], report["outputs_match"]


def test_onnx_share_reads_qdq_and_dynamic_graphs(digits, digits_source, tmp_path):
    """The ONNX reading: full QDQ INT8 and dynamic INT8 compute every weight in integer; the same QDQ recipe
    with the big MatMul excluded keeps ~94% of the weights float and is mixed."""
    from toolkit.conversion import registry
    from toolkit.runtimes.inspection.share import measure, onnx_layers

    full = registry.build(digits_request(digits_source, digits, tmp_path / "w", format="onnx", precision="int8"),
                          tmp_path / "int8.onnx")
    layers = onnx_layers(full.path)
    big = max(layers, key=lambda layer: layer.params)
    assert big.integer and big.op == "Gemm" and big.params == 512 * 256  # the Dense(256) after the Flatten
    assert measure(full.path) == QuantizedShare(1.0, 1.0, measure(full.path).quantized_bytes, 0, ())
    dynamic = registry.build(digits_request(digits_source, digits, tmp_path / "w", format="onnx",
                                            precision="dynamic"), tmp_path / "dynamic.onnx")
    assert measure(dynamic.path).weights > 0.99
    mixed = registry.build(digits_request(digits_source, digits, tmp_path / "w", format="onnx", precision="int8",
                                          nodes_to_exclude=(big.name,)), tmp_path / "mixed.onnx")
    share = measure(mixed.path)
    assert share is not None and share.mixed and share.float_layers[0].name == big.name, share
    assert 0.9 < share.float_layers[0].weights < 1.0 and 0 < share.macs < 1
    assert precision_label(Precision.INT8, None, share).startswith("int8 mixed: ")


def test_old_manifests_read_without_a_share(tmp_path) -> None:
    """A manifest written before the share existed reads back with ``quantized`` None; a written one round-trips."""
    from toolkit.model.artifact import ArtifactRecord
    from toolkit.model.quantized import FloatLayer
    from toolkit.model.reading import read_record

    share = QuantizedShare(0.25, 0.4, 100, 900, (FloatLayer("dense", "MatMul", 0.75, 0.6, "kept float as asked"),))
    record = ArtifactRecord("m.onnx", Format.ONNX, Precision.INT8, "0" * 64, 1, (), (), None, quantized=share)
    written = json.loads(json.dumps(record.to_dict()))
    back = read_record(ArtifactRecord, written, docs="docs")
    assert back == record and back.quantized is not None and back.quantized.mixed
    assert np.isclose(back.quantized.float_layers[0].weights, 0.75)
    del written["quantized"]
    assert read_record(ArtifactRecord, written, docs="docs").quantized is None
