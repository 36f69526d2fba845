"""Every output judged for what it is, on three trained models whose first output misleads a whole-model guess
(tests/fixtures/role_models.py): a face stage (box offsets, landmarks, face probability), a CTC-style
recognizer [1, T, C] and a transcriber with three time x pitch maps. On each, the INT8 artifacts the TFLite
and ONNX routes build are kept, and a broken copy (one head's int8 weight scales written 1000x too small, so
that head's output collapses while the artifact still runs) is refused by that output's own metric. The face
stage also goes PyTorch -> TFLite (litert-torch PT2E), where its outputs are unnamed (output_0..2).
"""

from __future__ import annotations

import importlib.util
import json
import platform
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.role_models import (
    RoleModel, TorchRoleModel, collapse_head, float_outputs, run_artifact, torch_float_outputs,
)
from toolkit import api
from toolkit.conversion.onnx.saturation import HOST_SATURATES, REDUCE_RANGE_NOTE, X86_ARCHES
from toolkit.model.platform import normalize_arch
from toolkit.verification import detection, segmentation
from toolkit.verification.outputs import verify_outputs
from toolkit.model.tolerance import Tolerance

FORMATS = ("tflite", "onnx")


# onnxruntime's U8S8 kernels saturate on x86 without VNNI (toolkit.conversion.onnx.saturation). The default target
# here is this host's profile: on x86 its static INT8 ONNX has 7-bit weights (reduce_range) from the start.
X86 = normalize_arch(platform.machine()) in X86_ARCHES


def _bundle(model: RoleModel, out: Path, formats: tuple[str, ...] = FORMATS, **options: Any) -> dict[str, Any]:
    api.convert(model.model, out=out, precisions=["fp32", "int8"], formats=list(formats),
                calibration=model.calibration, eval_data=model.eval, use_cache=False,
                progress=lambda message: None, **options)
    return json.loads((out / "manifest.json").read_text())


def _artifact(manifest: dict[str, Any], fmt: str, precision: str = "int8") -> dict[str, Any]:
    return next(a for a in manifest["artifacts"] if a["format"] == fmt and a["precision"] == precision)


def _roles(record: dict[str, Any]) -> dict[str, str]:
    return {o["name"]: o["role"] for o in record["verification"]["outputs"]}


def _metrics(record: dict[str, Any], name: str) -> dict[str, Any]:
    return next(o["metrics"] for o in record["verification"]["outputs"] if o["name"] == name)


def _kept(record: dict[str, Any]) -> None:
    """Verified within tolerance (a host-timing mark such as ``slower`` is not about accuracy)."""
    v = record["verification"]
    assert record["status"] in ("ok", "slower", "no_speedup_measured"), (record["status"], v)
    assert v["vacuous"] is None


def _broken(model: RoleModel, bundle: Path, record: dict[str, Any], head: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The verdict on a copy of the artifact with ``head`` collapsed, against the float model."""
    broken = collapse_head(bundle / record["file"], head, tmp_path / f"broken-{record['file']}")
    reference = float_outputs(model.model, model.x_eval)
    return verify_outputs(reference, run_artifact(broken, model.x_eval, record), tolerance=Tolerance(),
                          output_names=list(model.outputs))


# ------------------------------------------------------------------------------------------------ face stage


@pytest.fixture(scope="module")
def face_bundle(face_stage: RoleModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("face") / "bundle"
    return out, _bundle(face_stage, out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_face_stage_int8_is_judged_per_output_and_kept(face_bundle: tuple[Path, dict[str, Any]], fmt: str) -> None:
    _, manifest = face_bundle
    record = _artifact(manifest, fmt)
    v = record["verification"]
    if fmt == "onnx":  # this host's profile: 7-bit weights on x86 (its devices may lack VNNI), 8-bit elsewhere
        assert record["recipe"]["reduce_range"] is X86, record["recipe"]
        assert (REDUCE_RANGE_NOTE in record["notes"]) is X86, record["notes"]
        assert not any(n.startswith("reduce_range retry: ") for n in record["notes"]), record["notes"]  # from the start
    _kept(record)
    assert v["task"] == "per-output" and v["task_source"].startswith("inferred")
    assert _roles(record) == {"offsets": "boxes", "landmarks": "landmarks", "face": "classification"}
    assert _metrics(record, "face")["top1_agreement"] >= 0.99
    assert _metrics(record, "landmarks")["error_to_spread"] < 0.15
    assert _metrics(record, "offsets")["error_to_range"] < 0.25
    assert all(o["role_source"].startswith("inferred: ") for o in v["outputs"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_face_stage_old_first_output_guess_drops_the_good_int8(face_stage: RoleModel,
                                                              face_bundle: tuple[Path, dict[str, Any]],
                                                              fmt: str) -> None:
    """The old inference read output 0 ([1, 4] box offsets) as a classifier: top-1 agreement over the four
    offsets drops the INT8 that keeps every face decision and landmark."""
    bundle, manifest = face_bundle
    record = _artifact(manifest, fmt)
    outputs = run_artifact(bundle / record["file"], face_stage.x_eval, record)
    reference = float_outputs(face_stage.model, face_stage.x_eval)
    per_output = verify_outputs(reference, outputs, tolerance=Tolerance(), output_names=list(face_stage.outputs))
    assert per_output.ok, per_output.failures
    old_guess = verify_outputs(reference, outputs, tolerance=Tolerance(), task="classification",
                               output_names=list(face_stage.outputs))
    assert any(f.startswith("top-1 agreement with the float model") for f in old_guess.failures), old_guess.failures


@pytest.mark.parametrize("fmt", FORMATS)
def test_face_stage_int8_with_collapsed_landmarks_is_refused_by_the_landmarks(
        face_stage: RoleModel, face_bundle: tuple[Path, dict[str, Any]], fmt: str, tmp_path: Path) -> None:
    bundle, manifest = face_bundle
    verdict = _broken(face_stage, bundle, _artifact(manifest, fmt), "landmarks", tmp_path)
    assert not verdict.ok
    assert any(f.startswith("landmarks (landmarks): RMS error against their spread") for f in verdict.failures)
    assert not any(f.startswith(("face (", "offsets (")) for f in verdict.failures), verdict.failures


@pytest.fixture(scope="module")
def face_pi_bundle(face_stage: RoleModel,
                   tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[tuple[str, dict]]]:
    """The face stage for a Pi, converted where the probe reads an AVX2-only x86 CPU (U8S8 saturates): every
    onnxruntime session the convert opens is recorded with its config entries (the sessions are real)."""
    from tests.fixtures.cpu_flags import AVX2, probe_flags
    from tests.fixtures.verification_child import runs_in_this_process
    from toolkit.runtimes.execution.onnx import OnnxSession

    out = tmp_path_factory.mktemp("face-pi") / "bundle"
    opened: list[tuple[str, dict]] = []
    real_init = OnnxSession.__init__

    def recorded(self, path, *, threads=None, config=None):  # type: ignore[no-untyped-def]
        opened.append((Path(path).name, dict(config or {})))
        real_init(self, path, threads=threads, config=config)

    with probe_flags(AVX2), pytest.MonkeyPatch.context() as patch:
        patch.setattr(OnnxSession, "__init__", recorded)
        runs_in_this_process(patch)  # the sessions recorded are this process's
        manifest = _bundle(face_stage, out, formats=("onnx",), target="raspberry-pi-4")
    return out, manifest, opened


def test_face_stage_int8_onnx_for_an_arm_target_is_verified_with_its_numerics_where_this_host_saturates(
        face_pi_bundle: tuple[Path, dict[str, Any], list[tuple[str, dict]]]) -> None:
    """A Pi's ARM kernels do not saturate: its INT8 ONNX is built with 8-bit weights. On a host whose x86 kernels
    do (no VNNI; here the probe's flags say so), that artifact is verified with onnxruntime's session option
    session.x64quantprecision = 1 (U8U8 kernels, as ARM computes it), recorded in its notes, and ships with
    8-bit weights: no 7-bit rebuild. This host's own CPU has VNNI, so the option changes no number here; that
    it reproduces an ARM device on a saturating host is findings.md section 7."""
    from toolkit.conversion.onnx.saturation import X64_QUANT_PRECISION, X64_QUANT_PRECISION_NOTE

    _, manifest, opened = face_pi_bundle
    record = _artifact(manifest, "onnx")
    assert record["status"] == "ok", (record["status"], record["verification"])
    assert _roles(record) == {"offsets": "boxes", "landmarks": "landmarks", "face": "classification"}
    assert _metrics(record, "face")["top1_agreement"] >= 0.99
    assert _metrics(record, "landmarks")["error_to_spread"] < 0.15
    assert _metrics(record, "offsets")["error_to_range"] < 0.25
    assert record["recipe"]["reduce_range"] is False and X64_QUANT_PRECISION_NOTE in record["notes"], record["notes"]
    assert REDUCE_RANGE_NOTE not in record["notes"]
    assert not any(n.startswith("reduce_range retry: ") for n in record["notes"]), record["notes"]
    int8 = [a for a in manifest["attempts"] if a["recipe"]["format"] == "onnx" and a["recipe"]["precision"] == "int8"]
    assert [a["recipe"]["reduce_range"] for a in int8] == [False] and int8[0]["outcome"] == "kept", int8
    # the verification sessions, in plan order: the fp32 candidate's as this host computes, the INT8's with the option
    assert [config for _, config in opened] == [{}, X64_QUANT_PRECISION], opened
    assert HOST_SATURATES not in " ".join(record["notes"])


# ------------------------------------------------------------------------------------------------ face stage, PyTorch

needs_litert_torch = pytest.mark.skipif(
    importlib.util.find_spec("litert_torch") is None,
    reason="litert-torch is not installed: pip install -e '.[litert-torch]' (CI gets it through '.[all]')",
)
TORCH_ROLES = {"output_0": "boxes", "output_1": "landmarks", "output_2": "classification"}


@pytest.fixture(scope="module")
def torch_face_bundle(torch_face_stage: TorchRoleModel,
                      tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("torch-face") / "bundle"
    model = torch_face_stage
    api.convert(model.factory, weights=model.weights, calibration=model.calibration, eval_data=model.eval,
                input_shapes={"image": (1, 1, 24, 24)}, precisions=["fp32", "int8"], formats=["tflite"], out=out,
                use_cache=False, progress=lambda message: None)
    return out, json.loads((out / "manifest.json").read_text())


@needs_litert_torch
def test_torch_face_stage_int8_is_judged_per_output_by_its_values_and_kept(
        torch_face_bundle: tuple[Path, dict[str, Any]]) -> None:
    """No output name tells anything (output_0..2): the roles come from the shapes and values alone."""
    _, manifest = torch_face_bundle
    record = _artifact(manifest, "tflite")
    _kept(record)
    v = record["verification"]
    assert v["task"] == "per-output" and v["task_source"].startswith("inferred")
    assert _roles(record) == TORCH_ROLES
    assert all(o["role_source"].startswith("inferred: ") for o in v["outputs"])
    assert _metrics(record, "output_2")["top1_agreement"] >= 0.99
    assert _metrics(record, "output_1")["error_to_spread"] < 0.15
    assert _metrics(record, "output_0")["error_to_range"] < 0.25


@needs_litert_torch
def test_torch_face_stage_int8_with_collapsed_landmarks_is_refused_by_the_landmarks(
        torch_face_stage: TorchRoleModel, torch_face_bundle: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """The landmarks head (Linear(64, 10): its int8 weight tensor is the one of shape (10, 64)) collapsed; the
    good artifact's own outputs pass the same judgement, the first-output guess drops them."""
    bundle, manifest = torch_face_bundle
    record = _artifact(manifest, "tflite")
    reference = torch_float_outputs(torch_face_stage, torch_face_stage.x_eval)
    names = list(TORCH_ROLES)
    good = run_artifact(bundle / record["file"], torch_face_stage.x_eval, record)
    assert verify_outputs(reference, good, tolerance=Tolerance(), output_names=names).ok
    old_guess = verify_outputs(reference, good, tolerance=Tolerance(), task="classification", output_names=names)
    assert any(f.startswith("top-1 agreement with the float model") for f in old_guess.failures), old_guess.failures
    broken = collapse_head(bundle / record["file"], "landmarks", tmp_path / "broken.tflite", shape=(10, 64))
    verdict = verify_outputs(reference, run_artifact(broken, torch_face_stage.x_eval, record), tolerance=Tolerance(),
                             output_names=names)
    assert not verdict.ok
    assert any(f.startswith("output_1 (landmarks): RMS error against their spread") for f in verdict.failures), \
        verdict.failures
    assert not any(f.startswith(("output_0 (", "output_2 (")) for f in verdict.failures), verdict.failures


# ------------------------------------------------------------------------------------------------ CTC recognizer


@pytest.fixture(scope="module")
def ctc_bundle(ctc_recognizer: RoleModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("ctc") / "bundle"
    return out, _bundle(ctc_recognizer, out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ctc_recognizer_is_a_sequence_with_an_evident_blank_and_its_int8_is_kept(
        ctc_bundle: tuple[Path, dict[str, Any]], fmt: str) -> None:
    _, manifest = ctc_bundle
    for precision in ("fp32", "int8"):
        record = _artifact(manifest, fmt, precision)
        _kept(record)
        v = record["verification"]
        assert v["task"] == "sequence" and "CTC blank" in v["task_source"]
        m = _metrics(record, "chars")
        assert m["blank"] == 0 and m["string_agreement"] >= 0.99 and m["step_agreement"] >= 0.99


def test_ctc_output_was_read_as_a_one_class_map_over_the_batch_axis(ctc_recognizer: RoleModel,
                                                                   ctc_bundle: tuple[Path, dict[str, Any]]) -> None:
    """The old reading took [1, T, C]'s batch axis for its one class channel: a binary mask over the T x C
    cells (probability > 0.5), scored by mask IoU, which says nothing of the characters read. The batch axis
    is never a class axis now: the record is a sequence judged on its decoded strings."""
    bundle, manifest = ctc_bundle
    record = _artifact(manifest, "tflite")
    reference = np.stack([s[0] for s in float_outputs(ctc_recognizer.model, ctc_recognizer.x_eval)])
    actual = np.stack([s[0] for s in run_artifact(bundle / record["file"], ctc_recognizer.x_eval, record)])
    assert segmentation.class_axis(reference.shape[1:]) is None
    old = segmentation.segmentation_metrics(reference, actual, axis=0)
    assert old.classes == 2  # one channel (the batch axis) read as a mask, not 11 classes per step
    assert record["verification"]["task"] == "sequence" and "string_agreement" in _metrics(record, "chars")


@pytest.mark.parametrize("fmt", FORMATS)
def test_ctc_int8_with_a_collapsed_head_is_refused_on_the_decoded_strings(
        ctc_recognizer: RoleModel, ctc_bundle: tuple[Path, dict[str, Any]], fmt: str, tmp_path: Path) -> None:
    bundle, manifest = ctc_bundle
    verdict = _broken(ctc_recognizer, bundle, _artifact(manifest, fmt), "chars", tmp_path)
    assert any(f.startswith("chars (sequence): CTC-decoded string agreement") for f in verdict.failures), \
        verdict.failures


# ------------------------------------------------------------------------------------------------ transcriber


@pytest.fixture(scope="module")
def music_bundle(transcriber: RoleModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("music") / "bundle"
    return out, _bundle(transcriber, out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_transcriber_maps_are_dense_not_a_detector_and_every_one_is_scored(
        transcriber: RoleModel, music_bundle: tuple[Path, dict[str, Any]], fmt: str) -> None:
    _, manifest = music_bundle
    record = _artifact(manifest, fmt)
    _kept(record)
    v = record["verification"]
    assert v["task"] == "per-output" and "recall" not in v["task_metrics"]
    assert _roles(record) == {"notes": "dense", "onsets": "dense", "contour": "dense"}
    for name in transcriber.outputs:
        m = _metrics(record, name)
        assert m["iou"] >= 0.9 and m["positive_fraction"] > 0.001, (name, m)
    reference = [np.stack([s[k] for s in float_outputs(transcriber.model, transcriber.x_eval[:20])]) for k in range(3)]
    assert detection.ssd_layout(reference, list(transcriber.outputs)) is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_transcriber_int8_with_collapsed_onsets_is_refused_by_the_onsets(
        transcriber: RoleModel, music_bundle: tuple[Path, dict[str, Any]], fmt: str, tmp_path: Path) -> None:
    bundle, manifest = music_bundle
    verdict = _broken(transcriber, bundle, _artifact(manifest, fmt), "onsets", tmp_path)
    assert any(f.startswith("onsets (dense): IoU of the positions above 0.5") for f in verdict.failures), \
        verdict.failures
    assert not any(f.startswith(("notes (", "contour (")) for f in verdict.failures), verdict.failures

