"""``edgetk convert`` and ``edgetk inspect`` as a user runs them: exit codes, messages, nothing half-written.

The table of bad input runs through the CLI's entry point in this process (Keras and TensorFlow imported
once); the cases in ``IN_A_PROCESS`` (one that fails before a model loads, one after Keras has loaded one) run
again as real processes, which alone show the native frameworks' log lines and the interpreter's own output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.bundles import subset_bundle
from tests.fixtures.cli import assert_clean_error, run_edgetk, run_edgetk_inproc


def test_convert_prints_a_table_and_writes_the_bundle(digits_keras, digits_calibration, tmp_path) -> None:
    out = tmp_path / "bundle"
    result = run_edgetk("convert", digits_keras, "--calibration", digits_calibration, "--precision", "fp32",
                        "--precision", "int8", "--format", "onnx", "--out", out, "--no-cache")
    assert result.code == 0, result.stderr
    assert "model.int8.onnx" in result.stdout and "model.fp32.onnx" in result.stdout
    assert "building onnx int8" in result.stderr  # progress goes to stderr
    assert (out / "manifest.json").is_file() and (out / "model.int8.onnx").is_file()
    assert not list(tmp_path.glob(".bundle.*"))  # no staging directory left


def test_convert_json_is_one_document_and_the_cache_says_so(digits_keras, tmp_path) -> None:
    env = {"EDGETK_CACHE_DIR": str(tmp_path / "cache")}
    args = ["convert", digits_keras, "--precision", "fp32", "--format", "tflite", "--json"]
    first = run_edgetk(*args, "--out", tmp_path / "a", env=env)
    assert first.code == 0, first.stderr
    doc = first.json()
    assert doc["cached"] is False and doc["artifacts"][0]["file"] == "model.fp32.tflite"
    second = run_edgetk(*args, "--out", tmp_path / "b", env=env)
    assert second.code == 0 and second.json()["cached"] is True
    assert "reusing the cached conversion" in second.stderr


def test_default_name_and_location(digits_keras, tmp_path) -> None:
    result = run_edgetk("convert", digits_keras, "--precision", "fp32", "--format", "tflite", "--no-cache",
                        cwd=tmp_path)
    assert result.code == 0, result.stderr
    manifest = json.loads((tmp_path / "bundles" / "digits-generic-x86_64" / "manifest.json").read_text())
    assert manifest["name"] == "digits-generic-x86_64"


def test_inspect_artifact_and_bundle(digits_bundle, tmp_path) -> None:
    # the INT8 TFLite artifact of the session's digits bundle (converted once per run, not again here)
    out = subset_bundle(digits_bundle.bundle_dir, tmp_path / "b", ["model.int8.tflite"])
    text = run_edgetk("inspect", out / "model.int8.tflite")
    assert text.code == 0 and "scale=" in text.stdout and "CONV_2D" in text.stdout
    doc = run_edgetk("inspect", out / "model.int8.tflite", "--json").json()
    assert doc["inputs"][0]["dtype"] == "int8" and doc["inputs"][0]["quantization"]["scale"]
    assert doc["quantized_ops"] >= 4 and doc["op_counts"]["CONV_2D"] == 2
    bundle_doc = run_edgetk("inspect", out, "--json").json()
    assert bundle_doc["manifest"]["name"] and len(bundle_doc["artifacts"]) == 1


# ------------------------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, digits_keras):
    root = tmp_path_factory.mktemp("bad")
    truncated = root / "truncated.keras"
    truncated.write_bytes(Path(digits_keras).read_bytes()[:2000])
    (root / "notsaved").mkdir()
    (root / "notsaved" / "readme.txt").write_text("hello")
    (root / "model.xyz").write_text("?")
    (root / "broken.onnx").write_bytes(b"\x08\x07garbage")
    np.save(root / "empty.npy", np.zeros((0, 8, 8, 1), np.float32))
    np.save(root / "rank.npy", np.zeros((10, 8, 8), np.float32))
    np.save(root / "shape.npy", np.zeros((10, 9, 9, 1), np.float32))
    np.save(root / "dtype.npy", np.zeros((10, 8, 8, 1), np.int32))
    nan = np.zeros((10, 8, 8, 1), np.float32)
    nan[3, 2, 2, 0] = np.nan
    np.save(root / "nan.npy", nan)
    inf = np.zeros((10, 8, 8, 1), np.float32)
    inf[0, 0, 0, 0] = np.inf
    np.save(root / "inf.npy", inf)
    np.savez(root / "wrongkey.npz", pixels=np.zeros((10, 8, 8, 1), np.float32))
    (root / "pickle.npy").write_bytes(b"not numpy")
    return root


BAD_CASES = [
    # (id, args built from the files, exit code, words the message must contain)
    ("missing-source", lambda f, m: [f / "nope.keras"], 2, ["does not exist"]),
    ("unknown-kind", lambda f, m: [f / "model.xyz"], 2, ["cannot tell what kind of model"]),
    ("truncated-model", lambda f, m: [f / "truncated.keras"], 2, ["truncated.keras"]),
    ("not-a-savedmodel", lambda f, m: [f / "notsaved"], 2, ["not a savedmodel"]),
    ("corrupt-onnx", lambda f, m: [f / "broken.onnx"], 2, ["broken.onnx"]),
    ("onnx-to-tflite", lambda f, m: [f / "broken.onnx", "--format", "tflite"], 2, ["onnx to tflite",
                                                                                     "original framework"]),
    ("empty-calibration", lambda f, m: [m, "--calibration", f / "empty.npy"], 2, ["empty"]),
    ("wrong-rank", lambda f, m: [m, "--calibration", f / "rank.npy"], 2, ["rank 3", "image"]),
    ("wrong-shape", lambda f, m: [m, "--calibration", f / "shape.npy"], 2, ["(10, 9, 9, 1)", "image"]),
    ("wrong-dtype", lambda f, m: [m, "--calibration", f / "dtype.npy"], 2, ["dtype int32"]),
    ("nan", lambda f, m: [m, "--calibration", f / "nan.npy"], 2, ["nan or inf"]),
    ("inf", lambda f, m: [m, "--calibration", f / "inf.npy"], 2, ["nan or inf"]),
    ("wrong-key", lambda f, m: [m, "--calibration", f / "wrongkey.npz"], 2, ["no array for input 'image'"]),
    ("not-numpy", lambda f, m: [m, "--calibration", f / "pickle.npy"], 2, ["cannot read"]),
    ("missing-calibration", lambda f, m: [m, "--calibration", f / "none.npz"], 2, ["does not exist"]),
    ("int8-without-data", lambda f, m: [m, "--precision", "int8"], 2, ["int8 needs calibration"]),
    ("bad-input-shape", lambda f, m: [m, "--input-shape", "image=1,x"], 2, ["--input-shape"]),
    ("unknown-input-name", lambda f, m: [m, "--input-shape", "pixels=1,8,8,1"], 2, ["not an input"]),
    ("unknown-target", lambda f, m: [m, "--target", "raspbery-pi-4"], 2, ["raspberry-pi-4"]),
]


IN_A_PROCESS = ("truncated-model", "wrong-rank")
RUNS = [pytest.param(c, True, id=c[0]) for c in BAD_CASES] + \
    [pytest.param(c, False, id=f"{c[0]}-process") for c in BAD_CASES if c[0] in IN_A_PROCESS]


@pytest.mark.parametrize(("case", "in_process"), RUNS)
def test_bad_input_gets_a_plain_message(case, in_process, bad_files, digits_keras, tmp_path) -> None:
    _, build, code, needles = case
    out = tmp_path / "out"
    edgetk = run_edgetk_inproc if in_process else run_edgetk
    result = edgetk("convert", *build(bad_files, digits_keras), "--out", out, "--no-cache")
    assert_clean_error(result, code, *needles)
    lines = result.stderr.strip().splitlines()
    error_at = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    assert len(lines) - error_at <= 2, result.stderr  # one message line and one hint line
    assert all(not line.startswith(("I0000", "E0000", "W0000", "WARNING")) for line in lines), result.stderr
    assert not out.exists()
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_unwritable_output_directory(digits_keras, tmp_path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "file").write_text("x")  # a file where a directory is needed cannot be made writable by root
    result = run_edgetk_inproc("convert", digits_keras, "--precision", "fp32", "--format", "tflite",
                               "--out", locked / "file" / "bundle", "--no-cache")
    assert_clean_error(result, 2, "cannot write")


def test_existing_bundle_is_replaced_only_with_force(digits_keras, tmp_path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run_edgetk_inproc("convert", digits_keras, "--precision", "fp32", "--out", out, "--no-cache")
    assert_clean_error(result, 2, "already exists", "--force")
    assert (out / "keep.txt").read_text() == "mine"


def test_debug_shows_the_traceback(bad_files) -> None:
    result = run_edgetk("--debug", "convert", bad_files / "model.xyz")
    assert result.code == 2 and "Traceback" in result.stderr


def test_few_calibration_samples_warn(digits_keras, digits, tmp_path) -> None:
    few = tmp_path / "few.npy"
    np.save(few, digits.x_calib[:20])
    result = run_edgetk("convert", digits_keras, "--calibration", few, "--precision", "int8", "--format", "onnx",
                        "--out", tmp_path / "b", "--no-cache")
    assert result.code == 0, result.stderr
    assert "warning: only 16 calibration samples" in result.stderr
