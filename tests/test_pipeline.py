"""The convert stage end to end through the Python API: real converters, real runtimes, numbers asserted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolkit.delivery.bundle import GOLDEN_INPUTS, load_npz, read_bundle
from toolkit.errors import UsageError
from toolkit.runtimes.inspection import inspect_model
from toolkit.conversion.pipeline import ConvertOptions, ConvertResult, bundle_name, convert_bundle

ALL = ("fp32", "fp16", "dynamic", "int8")  # what digits_bundle (tests/fixtures/bundles.py) converts, both formats


def test_manifest_follows_the_contract(digits_bundle: ConvertResult) -> None:
    data = json.loads((digits_bundle.bundle_dir / "manifest.json").read_text())
    for key in ("schema_version", "name", "created_at", "toolkit_version", "source", "target", "preprocessing",
                "labels", "calibration", "artifacts", "runner"):
        assert key in data, key
    assert set(data["source"]) >= {"path", "sha256", "framework"}
    assert data["source"]["framework"] == "keras"
    assert data["target"]["name"] == "generic-x86_64"
    assert data["calibration"]["samples"] == 200
    files = sorted(a["file"] for a in data["artifacts"])
    assert files == sorted(f"model.{p}.{f}" for p in ALL for f in ("tflite", "onnx"))
    for artifact in data["artifacts"]:
        assert set(artifact) >= {"file", "format", "precision", "sha256", "bytes", "inputs", "outputs", "verification"}
        assert set(artifact["verification"]) >= {"max_abs_error", "mean_abs_error", "cosine_similarity",
                                                 "top1_agreement", "samples"}
        assert artifact["verification"]["samples"] == 497
        for spec in artifact["inputs"] + artifact["outputs"]:
            assert set(spec) >= {"name", "shape", "dtype", "quantization"}
    read_bundle(digits_bundle.bundle_dir)  # every hash matches


def _accuracy(path: Path, digits) -> float:
    """Top-1 accuracy measured here, independently of the pipeline's own verification."""
    from toolkit.runtimes.execution import open_session

    session = open_session(path)
    name = session.inputs[0].name
    hits = 0
    for x, y in zip(digits.x_heldout, digits.y_heldout):
        hits += int(np.argmax(session.run({name: x[None]})[0]) == y)
    session.close()
    return hits / len(digits.y_heldout)


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_int8_keeps_accuracy_within_one_point(digits_bundle: ConvertResult, digits, fmt: str) -> None:
    float_acc = _accuracy(digits_bundle.bundle_dir / f"model.fp32.{fmt}", digits)
    int8_acc = _accuracy(digits_bundle.bundle_dir / f"model.int8.{fmt}", digits)
    assert len(digits.y_heldout) >= 400
    assert float_acc > 0.9
    assert int8_acc >= float_acc - 0.01, (float_acc, int8_acc)
    record = digits_bundle.manifest.artifact(f"model.int8.{fmt}")
    assert record.verification is not None and record.verification.accuracy == pytest.approx(int8_acc)


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_quantized_files_are_smaller(digits_bundle: ConvertResult, fmt: str) -> None:
    sizes = {a.precision: a.bytes for a in digits_bundle.manifest.artifacts if a.format == fmt}
    assert sizes["int8"] <= 0.3 * sizes["fp32"], sizes
    assert sizes["fp16"] <= 0.55 * sizes["fp32"], sizes
    assert sizes["dynamic"] <= 0.3 * sizes["fp32"], sizes


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_int8_label_means_quantized_operators(digits_bundle: ConvertResult, fmt: str) -> None:
    info = inspect_model(digits_bundle.bundle_dir / f"model.int8.{fmt}")
    assert info.quantized_ops >= 4  # two convs and two dense layers compute in integer
    assert inspect_model(digits_bundle.bundle_dir / f"model.fp32.{fmt}").quantized_ops == 0


def test_golden_data_matches_the_artifacts(digits_bundle: ConvertResult) -> None:
    bundle = digits_bundle.bundle_dir
    inputs = load_npz(bundle / GOLDEN_INPUTS)
    assert inputs["input_0"].shape == (8, 1, 8, 8, 1)
    for record in digits_bundle.manifest.artifacts:
        assert record.golden is not None
        outputs = load_npz(bundle / record.golden.outputs)
        assert outputs["output_0"].shape == (8, 1, 10)
        assert record.golden.atol > 0
    assert digits_bundle.manifest.runner is not None
    assert (bundle / digits_bundle.manifest.runner.file).is_file()


def test_every_attempt_is_recorded(digits_bundle: ConvertResult) -> None:
    kept = [a for a in digits_bundle.manifest.attempts if a.outcome == "kept"]
    assert len(kept) == 8
    assert all(a.reason.startswith("asked for") for a in kept)


def test_sequential_keras_model_converts_to_onnx(digits_keras_sequential, digits_eval, tmp_path) -> None:
    result = convert_bundle(
        ConvertOptions(source=str(digits_keras_sequential), eval_data=digits_eval, precisions=("fp32",),
                       formats=("onnx",), out=tmp_path / "b", use_cache=False),
        progress=lambda message: None,
    )
    verification = result.manifest.artifact("model.fp32.onnx").verification
    assert verification is not None
    assert verification.max_abs_error < 1e-4
    assert verification.top1_agreement == 1.0


def test_tflite_source_is_taken_as_it_is(digits_bundle: ConvertResult, digits_eval, tmp_path) -> None:
    source = tmp_path / "given.tflite"
    source.write_bytes((digits_bundle.bundle_dir / "model.int8.tflite").read_bytes())
    result = convert_bundle(
        ConvertOptions(source=str(source), eval_data=digits_eval, out=tmp_path / "b", use_cache=False),
        progress=lambda message: None,
    )
    (record,) = result.manifest.artifacts
    assert record.file == "model.int8.tflite"
    assert record.inputs[0].dtype == "int8" and record.inputs[0].quantization is not None
    assert record.sha256 == digits_bundle.manifest.artifact("model.int8.tflite").sha256
    assert "taken as it is (no conversion)" in record.notes


def test_fp16_tflite_source_is_built_logged_and_shipped_as_fp16(digits_tflite, digits_eval, tmp_path) -> None:
    """The log line, the attempts and the artifact agree on the file's precision (it said "building tflite fp32"
    and shipped model.fp16.tflite)."""
    source = tmp_path / "given.tflite"
    source.write_bytes(digits_tflite["fp16"].read_bytes())
    messages: list[str] = []
    result = convert_bundle(
        ConvertOptions(source=str(source), eval_data=digits_eval, out=tmp_path / "b", use_cache=False),
        progress=messages.append,
    )
    (record,) = result.manifest.artifacts
    assert (record.file, record.precision) == ("model.fp16.tflite", "fp16")
    building = [m for m in messages if m.startswith("building ")]
    assert building == ["building tflite fp16"], messages
    tflite = [(a.recipe.precision, a.outcome) for a in result.manifest.attempts if a.recipe.format == "tflite"]
    assert ("fp16", "kept") in tflite and ("fp16", "failed") not in tflite, tflite


def test_tflite_source_plan_says_what_the_calibration_data_are_for(digits_bundle: ConvertResult,
                                                                    digits_calibration, tmp_path) -> None:
    source = tmp_path / "given.tflite"
    source.write_bytes((digits_bundle.bundle_dir / "model.fp32.tflite").read_bytes())
    result = convert_bundle(
        ConvertOptions(source=str(source), calibration=digits_calibration, out=tmp_path / "b", use_cache=False),
        progress=lambda message: None,
    )
    (record,) = result.manifest.artifacts
    assert record.precision == "fp32"  # the file's own precision: nothing was quantized
    skipped = [a for a in result.manifest.attempts
               if a.outcome == "failed" and (a.recipe.format, a.recipe.precision) == ("tflite", "int8")]
    assert skipped, result.manifest.attempts
    assert "taken as it is" in skipped[0].reason
    assert "calibration data supply only the held-out inputs" in skipped[0].reason
    assert result.manifest.calibration is not None


def test_same_inputs_reuse_the_cache(digits_keras, digits_eval, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("EDGETK_CACHE_DIR", str(tmp_path / "cache"))
    options = dict(source=str(digits_keras), eval_data=digits_eval, precisions=("fp32",), formats=("onnx",))
    first = convert_bundle(ConvertOptions(out=tmp_path / "a", **options), progress=lambda m: None)
    messages: list[str] = []
    second = convert_bundle(ConvertOptions(out=tmp_path / "b", **options), progress=messages.append)
    assert not first.cached and second.cached
    assert any("reusing the cached conversion" in m for m in messages)
    assert second.manifest.artifacts == first.manifest.artifacts


def test_image_folder_calibration_and_labels(digits_keras, tmp_path) -> None:
    repo = Path(__file__).resolve().parents[1]
    result = convert_bundle(
        ConvertOptions(source=str(digits_keras), calibration=repo / "calibration" / "digits-images",
                       labels=repo / "calibration" / "digits" / "labels.txt", precisions=("int8",),
                       formats=("tflite",), out=tmp_path / "b", use_cache=False),
        progress=lambda m: None,
    )
    manifest = result.manifest
    assert manifest.preprocessing is not None
    assert manifest.preprocessing.color_order == "GRAY" and manifest.preprocessing.layout == "NHWC"
    assert manifest.labels == tuple(str(i) for i in range(10))
    assert manifest.calibration is not None and manifest.calibration.samples == 51  # 64 minus 20% held out
    verification = manifest.artifact("model.int8.tflite").verification
    assert verification is not None and verification.top1_agreement is not None
    assert verification.top1_agreement >= 0.9


def test_savedmodel_directory_source(digits_keras, digits_eval, tmp_path) -> None:
    import keras

    saved = tmp_path / "saved"
    keras.saving.load_model(digits_keras).export(str(saved))
    result = convert_bundle(
        ConvertOptions(source=str(saved), eval_data=digits_eval, precisions=("fp32",), out=tmp_path / "b",
                       use_cache=False),
        progress=lambda m: None,
    )
    assert {a.format for a in result.manifest.artifacts} == {"tflite", "onnx"}
    for record in result.manifest.artifacts:
        assert record.verification is not None and record.verification.max_abs_error < 1e-4


def test_bundle_name_default() -> None:
    assert bundle_name("models/Digits V2.keras", "raspberry-pi-4") == "digits-v2-raspberry-pi-4"
    assert bundle_name("saved_model/", None) == "saved_model"


def test_a_factory_bundle_is_named_after_its_file_and_function() -> None:
    """Two projects' ``make_model`` factories get two bundles, not one overwritten by the other."""
    assert bundle_name("proj_a/Digits.py:make_model", "raspberry-pi-4") == "digits.make_model-raspberry-pi-4"
    assert bundle_name("proj_b/faces.py:make_model", "raspberry-pi-4") == "faces.make_model-raspberry-pi-4"
    assert bundle_name("vision.nets.faces:make_model", None) == "faces.make_model"


def test_existing_bundle_needs_force(digits_bundle: ConvertResult, digits_keras) -> None:
    with pytest.raises(UsageError, match="already exists"):
        convert_bundle(ConvertOptions(source=str(digits_keras), out=digits_bundle.bundle_dir))


def test_host_timings_never_demote_an_artifact_for_another_cpu(digits_keras, digits_calibration, tmp_path,
                                                                 monkeypatch) -> None:
    """A raspberry-pi-4 bundle built on this x86 host: even when INT8 is five times slower than fp32 here (the
    host clock replaced by fixed timings, fp32 timed first), the profile's first recipe stays ``ok`` and
    preferred; the host latency is recorded, labelled with the host CPU, and decides nothing (the device
    selects). Conversion, verification and everything else are real."""
    from toolkit.conversion.host_timing import host_cpu

    from tests.fixtures.verification_child import runs_in_this_process
    from toolkit.verification import verify

    timings = iter([1.0, 5.0])
    monkeypatch.setattr(verify, "median_latency_ms", lambda run, feed: next(timings))
    runs_in_this_process(monkeypatch)  # the fixed timings are this process's
    result = convert_bundle(
        ConvertOptions(source=str(digits_keras), calibration=digits_calibration, formats=("tflite",),
                       target="raspberry-pi-4", out=tmp_path / "b", use_cache=False),
        progress=lambda m: None,
    )
    manifest = result.manifest
    int8 = manifest.artifact("model.int8.tflite")
    assert int8.status == "ok" and int8.preferred
    assert not manifest.artifact("model.fp32.tflite").preferred
    assert int8.host_latency_ms == 5.0 and int8.fp32_latency_ms == 1.0 and int8.host_cpu == host_cpu()
    assert any("decides nothing" in note and host_cpu() in note for note in int8.notes)
    assert all(a.status != "slower" for a in manifest.artifacts)
    (attempt,) = [a for a in manifest.attempts if a.file == "model.int8.tflite"]
    assert attempt.outcome == "kept" and "slower" not in attempt.reason
