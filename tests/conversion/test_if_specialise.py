"""A model whose weights sit in an If branch a scalar input picks (a sample rate, as in Silero VAD) gets an INT8
artifact once that input has one value: ``--input-value sr=16000`` (or calibration data that give ``sr`` one
value) folds the If to its branch, the folded model is proven to compute the model at that value, and then it
is quantized (toolkit/conversion/onnx/specialise.py). The model is trained (two MLPs on the digits, one per
rate, tests/fixtures/if_models.py); onnxruntime, its quantizer and the convert stage are the real ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.if_models import IfModel, build_if_model
from tests.fixtures.models import Digits
from toolkit.conversion.pipeline import ConvertOptions, convert_bundle
from toolkit.errors import UsageError


@pytest.fixture(scope="module")
def if_model(digits: Digits, tmp_path_factory: pytest.TempPathFactory) -> IfModel:
    return build_if_model(digits, tmp_path_factory.mktemp("if-model") / "by_rate.onnx")


def _data(digits: Digits, folder: Path, rates: tuple[int, ...]) -> tuple[Path, Path]:
    """Calibration and eval .npz for the model (``image`` flattened, ``sr`` drawn from ``rates``, labels ``y``)."""
    rng = np.random.default_rng(0)
    flat = {"cal": digits.x_calib.reshape(len(digits.x_calib), -1), "eval": digits.x_heldout.reshape(
        len(digits.x_heldout), -1)}
    paths = []
    for what, images in flat.items():
        path = folder / f"{what}-{'-'.join(map(str, rates))}.npz"
        extra = {"y": digits.y_heldout} if what == "eval" else {}
        np.savez(path, image=images.astype(np.float32), sr=rng.choice(rates, size=(len(images), 1)).astype(np.int64),
                 **extra)
        paths.append(path)
    return paths[0], paths[1]


def _convert(model: IfModel, calibration: Path, eval_data: Path, out: Path, *values: str):  # -> Manifest
    return convert_bundle(ConvertOptions(
        source=str(model.path), target="generic-x86_64", calibration=calibration, eval_data=eval_data,
        formats=("onnx",), precisions=("fp32", "int8"), out=out, use_cache=False, input_values=values),
        progress=lambda message: None).manifest


def test_the_specialised_model_is_the_model_at_that_value(if_model: IfModel, digits: Digits, tmp_path: Path) -> None:
    import onnx
    import onnxruntime

    from toolkit.conversion.onnx.specialise import specialise

    model = onnx.load(str(if_model.path))
    images = digits.x_heldout.reshape(len(digits.x_heldout), -1).astype(np.float32)[:64]
    rate = np.array([16000], np.int64)
    folded = specialise(model, {"sr": rate}, {"image": images[:1], "sr": rate}, tmp_path / "probe.onnx")
    assert folded == ["by_rate: then_branch"]
    assert not [n for n in model.graph.node if n.op_type == "If"] and [i.name for i in model.graph.input] == [
        "image", "sr"]  # the input stays in the signature, unread
    onnx.save(model, str(tmp_path / "specialised.onnx"))
    ours = onnxruntime.InferenceSession(str(tmp_path / "specialised.onnx"), providers=["CPUExecutionProvider"])
    theirs = onnxruntime.InferenceSession(str(if_model.path), providers=["CPUExecutionProvider"])
    error = max(float(np.max(np.abs(ours.run(None, {"image": row[None], "sr": rate})[0]
                                    - theirs.run(None, {"image": row[None], "sr": rate})[0]))) for row in images)
    assert error <= 1e-6, error
    other = np.array([8000], np.int64)  # the specialised model is the 16 kHz one only: it no longer reads sr
    assert np.array_equal(ours.run(None, {"image": images[:1], "sr": other})[0],
                          ours.run(None, {"image": images[:1], "sr": rate})[0])
    assert not np.array_equal(theirs.run(None, {"image": images[:1], "sr": other})[0],
                              theirs.run(None, {"image": images[:1], "sr": rate})[0])


def test_int8_is_refused_with_the_if_and_kept_with_input_value(if_model: IfModel, digits: Digits,
                                                               tmp_path: Path) -> None:
    calibration, eval_data = _data(digits, tmp_path, (16000, 8000))  # both rates: no one branch
    before = _convert(if_model, calibration, eval_data, tmp_path / "before")
    refused = [a for a in before.attempts if a.recipe.precision == "int8"]
    assert refused and refused[0].outcome == "failed", [(a.recipe.precision, a.reason) for a in before.attempts]
    assert "sits inside an If/Loop/Scan body" in refused[0].reason and "--input-value" in refused[0].workaround
    assert [a.file for a in before.artifacts] == ["model.fp32.onnx"]

    after = _convert(if_model, calibration, eval_data, tmp_path / "after", "sr=16000")
    int8 = after.artifact("model.int8.onnx")
    assert int8.status in ("ok", "no_speedup_measured"), (int8.status, [a.reason for a in after.attempts])
    note = next(n for n in int8.notes if n.startswith("specialised on sr=16000"))
    assert "If by_rate: then_branch folded" in note and "max difference from the unspecialised model 0 " in note
    assert int8.verification is not None and int8.verification.accuracy is not None
    assert int8.verification.accuracy >= if_model.accuracy[16000] - 0.02, (int8.verification.accuracy, if_model)
    fp32 = after.artifact("model.fp32.onnx")  # the fp32 keeps its If: not specialised
    assert not any(n.startswith("specialised on") for n in fp32.notes)


def test_calibration_data_that_give_the_input_one_value_specialise_it_too(if_model: IfModel, digits: Digits,
                                                                          tmp_path: Path) -> None:
    calibration, eval_data = _data(digits, tmp_path, (16000,))
    manifest = _convert(if_model, calibration, eval_data, tmp_path / "bundle")
    int8 = manifest.artifact("model.int8.onnx")
    assert any(n.startswith("specialised on sr=16000") for n in int8.notes), int8.notes


def test_input_value_names_a_real_input_and_a_number() -> None:
    from toolkit.conversion.onnx.specialise import parse_input_values

    assert parse_input_values(["sr=16000"], ["image", "sr"]) == {"sr": 16000.0}
    with pytest.raises(UsageError, match="no input 'rate'") as caught:
        parse_input_values(["rate=16000"], ["image", "sr"])
    assert "image, sr" in (caught.value.hint or "")
    with pytest.raises(UsageError, match="NAME=VALUE"):
        parse_input_values(["sr"], ["image", "sr"])


def test_a_bad_input_value_is_one_plain_usage_error(if_model: IfModel, digits: Digits, tmp_path: Path) -> None:
    from tests.fixtures.cli import assert_clean_error, run_edgetk_inproc

    calibration, _ = _data(digits, tmp_path, (16000,))
    result = run_edgetk_inproc("convert", if_model.path, "--calibration", calibration, "--format", "onnx",
                               "--input-value", "rate=16000", "--out", tmp_path / "b", "--no-cache")
    assert_clean_error(result, 2, "--input-value 'rate=16000': the model has no input 'rate'", "image, sr")
