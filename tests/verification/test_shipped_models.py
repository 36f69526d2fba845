"""Verification on trained models that ship inside public wheels: PP-OCRv4's text detector (an ONNX dense
map, rapidocr-onnxruntime) and MediaPipe's BlazeFace (a TFLite SSD-style detector with separate box and
score outputs, mediapipe 0.10.14), on drawn faces and on crops of a real portrait with its face labelled by
hand; BlazeFace and selfie segmentation through the TFLite -> ONNX route. Numbers are checked against an
independent computation here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.ppocr import text_images
from tests.fixtures.real_models import cartoon_faces, face_photos
from toolkit import api
from toolkit.errors import ConversionError
from tests.fixtures.runner_output import report_doc

SIZE = 160  # PP-OCR det has dynamic H/W; 160x160 pages keep the INT8 build short


@pytest.fixture(scope="module")
def ppocr_bundle(ppocr_det: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("ppocr-verify")
    np.savez(work / "calib.npz", x=text_images(8, SIZE, seed=10))
    np.savez(work / "eval.npz", x=text_images(8, SIZE, seed=11))
    out = work / "bundle"
    api.convert(ppocr_det, calibration=work / "calib.npz", eval_data=work / "eval.npz", precisions=["int8"],
                formats=["onnx"], input_shapes={"x": (1, 3, SIZE, SIZE)}, out=out, use_cache=False,
                progress=lambda message: None)
    manifest = json.loads((out / "manifest.json").read_text())
    return {"dir": out, "work": work, "source": ppocr_det, "artifact": manifest["artifacts"][0],
            "reason": " ".join(a["reason"] for a in manifest["attempts"] if a.get("file") == "model.int8.onnx")}


def test_ppocr_int8_mask_iou_is_measured_as_segmentation(ppocr_bundle: dict[str, Any]) -> None:
    from toolkit.runtimes.execution import open_session

    artifact = ppocr_bundle["artifact"]
    v = artifact["verification"]
    assert v["task"] == "segmentation" and v["task_source"].startswith("inferred")
    assert v["outputs"][0]["slices"] == []  # rows with and without text are places, not channels
    metrics = v["task_metrics"]
    # the text mask (probability > 0.5) of the INT8 artifact against the float model's, measured here too
    pages = np.load(ppocr_bundle["work"] / "eval.npz")["x"]
    float_model = open_session(ppocr_bundle["source"], threads=2)
    int8_model = open_session(ppocr_bundle["dir"] / artifact["file"], threads=2)
    try:
        ref = np.concatenate([float_model.run({"x": p[None]})[0] for p in pages]) > 0.5
        act = np.concatenate([int8_model.run({int8_model.inputs[0].name: p[None]})[0] for p in pages]) > 0.5
    finally:
        float_model.close()
        int8_model.close()
    iou = float(np.logical_and(ref, act).sum() / np.logical_or(ref, act).sum())
    assert metrics["mean_iou"] == pytest.approx(iou, abs=1e-6)
    assert metrics["pixel_agreement"] == pytest.approx(float(np.mean(ref == act)), abs=1e-6)
    assert 0.02 < metrics["foreground_fraction"] < 0.5  # the pages hold text: the IoU means something
    assert metrics["mean_iou"] >= 0.75, metrics  # measured 2026-12-01 (see the report of that run)
    # the mask limit (min_mask_iou 0.9) is applied exactly when it is broken
    assert ("mask IoU vs float" in ppocr_bundle["reason"]) == (metrics["mean_iou"] < 0.9), ppocr_bundle["reason"]


@pytest.fixture(scope="module")
def blazeface(mediapipe_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("blazeface")
    np.savez(work / "faces.npz", input=cartoon_faces(12, seed=1))
    rng = np.random.default_rng(2)
    np.savez(work / "noise.npz", input=rng.uniform(-1, -0.9, (12, 128, 128, 3)).astype(np.float32))
    bundles = {}
    for name in ("faces", "noise"):
        out = work / f"bundle-{name}"
        api.convert(mediapipe_models["face_detection"], eval_data=work / f"{name}.npz", out=out, use_cache=False,
                    progress=lambda message: None)
        bundles[name] = json.loads((out / "manifest.json").read_text())["artifacts"][0]
    return bundles


def test_blazeface_is_verified_as_an_ssd_detector(blazeface: dict[str, Any]) -> None:
    v = blazeface["faces"]["verification"]
    assert v["task"] == "detection"
    assert "regressors" in v["task_source"] and "classificators" in v["task_source"]
    metrics = v["task_metrics"]
    assert metrics["layout"] == "ssd" and metrics["score_threshold"] == 0.5
    assert metrics["float_detections"] >= 30  # several anchors per drawn face
    # the artifact is the source file itself (TFLite is taken as it is): it must agree exactly
    assert metrics["recall"] == 1.0 and metrics["precision"] == 1.0
    assert v["vacuous"] is None and blazeface["faces"]["status"] == "ok"


def test_blazeface_without_faces_is_not_verified(blazeface: dict[str, Any]) -> None:
    """Inputs with nothing to detect: every number agrees, and the verdict says it proves nothing."""
    record = blazeface["noise"]
    v = record["verification"]
    assert v["task_metrics"]["float_detections"] < 10
    assert "detection(s) over the eval set" in v["vacuous"]
    assert record["status"] == "unverified"


@pytest.fixture(scope="module")
def blazeface_photos(mediapipe_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """BlazeFace taken as it is (TFLite) and through tf2onnx's TFLite frontend to ONNX along the generic-x86_64
    profile (fp32, INT8 U8S8 and its selective retries, then A16W8), calibrated on 64 crops of the portrait and
    verified on 24 others with the labelled face as ``y``."""
    work = tmp_path_factory.mktemp("blazeface-photos")
    images, labels = face_photos(24, seed=1)
    np.savez(work / "eval.npz", input=images, y=labels)
    np.savez(work / "calib.npz", input=face_photos(64, seed=2)[0])
    out = work / "bundle"
    api.convert(mediapipe_models["face_detection"], calibration=work / "calib.npz", eval_data=work / "eval.npz",
                target="generic-x86_64", formats=["tflite", "onnx"], out=out, use_cache=False,
                progress=lambda message: None)
    manifest = json.loads((out / "manifest.json").read_text())
    return {"work": work, "images": images, "labels": labels, "manifest": manifest, "out": out,
            "by_file": {a["file"]: a for a in manifest["artifacts"]}}


def _onnx_int8_attempts(bundle: dict[str, Any], activation_type: str) -> list[dict[str, Any]]:
    return [a for a in bundle["manifest"]["attempts"]
            if a["recipe"]["format"] == "onnx" and a["recipe"]["precision"] == "int8"
            and a["recipe"]["activation_type"] == activation_type]


def test_blazeface_finds_the_labelled_face_in_every_photo(mediapipe_models: dict[str, Path],
                                                          blazeface_photos: dict[str, Any]) -> None:
    """The float model, run here in LiteRT and decoded with MediaPipe's 896 anchors: one face per crop, at
    IoU >= 0.5 with the hand label; the manifest's float-vs-label figures say the same."""
    from ai_edge_litert.interpreter import Interpreter

    from toolkit.verification import detection

    interpreter = Interpreter(str(mediapipe_models["face_detection"]))
    interpreter.allocate_tensors()
    (feed,) = interpreter.get_input_details()
    outputs = {o["name"]: o["index"] for o in interpreter.get_output_details()}
    boxes, scores = [], []
    for image in blazeface_photos["images"]:
        interpreter.set_tensor(feed["index"], image[None])
        interpreter.invoke()
        boxes.append(interpreter.get_tensor(outputs["regressors"])[0])
        scores.append(interpreter.get_tensor(outputs["classificators"])[0])
    anchors = detection.SCHEMES[(896, 16)].table().rows
    assert anchors.shape == (896, 4) and anchors[0, :2].tolist() == [4.0, 4.0]  # the first 8-px cell's centre
    for box, logit, label in zip(boxes, scores, blazeface_photos["labels"]):
        best = int(np.argmax(logit[:, 0]))
        assert 1 / (1 + np.exp(-logit[best, 0])) > 0.75  # a confident face
        cx, cy = anchors[best, 0] + box[best, 0], anchors[best, 1] + box[best, 1]
        found = detection._xyxy(np.array([cx, cy, box[best, 2], box[best, 3]]))
        truth = detection._xyxy(label[0, 1:].astype(np.float64))
        assert detection._iou(found, truth[None])[0] >= 0.5, (found, truth)
    record = blazeface_photos["by_file"]["model.fp16.tflite"]
    metrics = record["verification"]["task_metrics"]
    assert metrics["anchors"].startswith("mediapipe-face-short-range")
    assert metrics["labelled_boxes"] == 24
    assert metrics["reference_label_recall"] == 1.0 and metrics["reference_label_precision"] >= 0.9
    assert metrics["label_recall"] == metrics["reference_label_recall"]  # the file itself: nothing lost
    assert record["status"] == "ok"


def test_blazeface_onnx_from_tflite_fp32_matches_and_int8_is_refused(
        blazeface_photos: dict[str, Any]) -> None:
    """ONNX from the .tflite file: fp32 finds what the float model finds, and the labelled faces; plain static
    INT8 (the toolkit's U8S8 QDQ, per-channel, MinMax) shifts BlazeFace's face logits and loses most of the
    float model's detections: the recall vs float refuses it, and its selective retries too."""
    fp32 = blazeface_photos["by_file"]["model.fp32.onnx"]
    assert any("from_tflite" in note for note in fp32["notes"])  # the route is recorded
    m = fp32["verification"]["task_metrics"]
    assert m["layout"] == "ssd" and m["float_detections"] >= 100  # several anchors per face
    assert m["recall"] == 1.0 and m["precision"] == 1.0
    assert m["label_recall"] == m["reference_label_recall"] == 1.0
    assert fp32["status"] in ("ok", "slower")
    int8 = _onnx_int8_attempts(blazeface_photos, "uint8")
    assert int8 and all(a["outcome"] == "dropped" for a in int8)  # full INT8, then selective retries or a stop
    # the retries were built, or fail fast measured that no float set could remove the spread error (both seen:
    # 2-5 rebuilds before fail fast; none after it, "the error is spread", 2026-12-06)
    assert any(a["recipe"]["nodes_to_exclude"] for a in int8) or (
        "selective quantization stopped" in int8[-1]["reason"]
        and "tried next" not in (int8[-1]["workaround"] or "")), int8
    for attempt in int8:
        m = attempt["metrics"]["verification"]["task_metrics"]
        # measured 2026-12-01 (earlier session): recall vs float 0.00 (0 of 426 float anchor detections) and label
        # recall 0.00 with 0, 3 and 10 layers in float alike. After the fifth session's merges (the checked ONNX
        # preparation, cheapest-first selective sets): recall vs float 0.39-0.41 (167-174 of 426) with all 24
        # labelled faces found; every try is still refused, by its recall vs float
        assert m["recall"] < 0.5, m
        assert "detection recall vs float" in attempt["reason"]


def test_blazeface_a16w8_onnx_keeps_the_faces_int8_lost(blazeface_photos: dict[str, Any]) -> None:
    """Where every 8-bit INT8 try lost the faces, the profile's A16W8 recipe (16-bit activations, 8-bit
    weights, int16 Q/DQ as ONNX Runtime contrib ops below opset 21) is built next and ships: it finds the
    float model's faces and the labelled ones, at half the fp32 file size. Honestly marked: slower than fp32
    on this CPU, or ok, never the cause of a refusal."""
    import onnx

    attempts = blazeface_photos["manifest"]["attempts"]
    onnx_order = [(a["recipe"]["precision"], a["recipe"]["activation_type"], a["outcome"]) for a in attempts
                  if a["recipe"]["format"] == "onnx" and a["recipe"]["precision"] == "int8"]
    assert onnx_order[-1] == ("int8", "int16", "kept"), onnx_order  # tried after every U8S8 try was dropped
    assert all(outcome == "dropped" for _, act, outcome in onnx_order[:-1] if act == "uint8")
    record = blazeface_photos["by_file"]["model.int8.onnx"]
    assert record["recipe"]["activation_type"] == "int16" and record["recipe"]["weight_type"] == "int8"
    assert record["status"] in ("ok", "slower", "no_speedup_measured")
    m = record["verification"]["task_metrics"]
    # measured 2026-12-01: recall vs float 0.932 (397 of 426 anchor detections), label recall 1.00 (24 of 24)
    assert m["recall"] >= 0.9, m
    assert m["label_recall"] >= 0.9 and m["reference_label_recall"] == 1.0, m
    assert record["bytes"] <= 0.6 * blazeface_photos["by_file"]["model.fp32.onnx"]["bytes"]
    assert any("com.microsoft" in note for note in record["notes"])
    model = onnx.load(str(blazeface_photos["out"] / "model.int8.onnx"))
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert opset <= 20  # what generic-x86_64's runtime loads (max_onnx_opset)
    zero_points = {i.name: i for i in model.graph.initializer}
    quantize = [n for n in qdq if n.op_type == "QuantizeLinear"]
    assert quantize and all(n.domain == "com.microsoft" for n in quantize)  # int16 Q below opset 21: contrib
    activation_types = {zero_points[n.input[2]].data_type for n in quantize
                        if len(n.input) > 2 and n.input[2] in zero_points}
    assert activation_types == {onnx.TensorProto.INT16}
    from toolkit.reporting.report import convert_table
    from toolkit.model.manifest import read_manifest

    text = convert_table(read_manifest(blazeface_photos["manifest"]), bundle_dir=blazeface_photos["out"])
    assert "model.int8.onnx (int8 A16W8)" in text and re.search(r"onnx int8( \(\d+ layers float\))?: ", text), text


def test_the_device_runner_runs_the_a16w8_onnx_artifact(blazeface_photos: dict[str, Any]) -> None:
    """The single-file runner (unchanged) loads the contrib int16 Q/DQ artifact in ONNX Runtime and matches
    its golden outputs, in a process of its own."""
    import subprocess
    import sys

    out = blazeface_photos["out"]
    proc = subprocess.run([sys.executable, str(out / "edgetk_runner.py"), "check", "--bundle", str(out), "--runs", "3"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    report = {r["artifact"]: r for r in report_doc(proc.stdout)["reports"]}["model.int8.onnx"]
    assert report["error"] is None and report["runtime"]["name"] == "onnxruntime", report
    assert report["outputs_match"]["ok"] is True, report["outputs_match"]


def test_selfie_segmentation_onnx_names_the_custom_op(mediapipe_models: dict[str, Path], tmp_path: Path) -> None:
    """Selfie segmentation's Convolution2DTransposeBias has no ONNX mapping in tf2onnx: one plain message that
    names the operator and the fix, raised before any artifact is written."""
    images = np.random.default_rng(3).uniform(0, 1, (6, 256, 256, 3)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", input_1=images)
    with pytest.raises(ConversionError) as caught:
        api.convert(mediapipe_models["selfie_segmentation"], eval_data=tmp_path / "eval.npz", precisions=["fp32"],
                    formats=["onnx"], out=tmp_path / "bundle", use_cache=False, progress=lambda message: None)
    text = caught.value.message + " " + (caught.value.hint or "")
    assert "Convolution2DTransposeBias" in text and "--format tflite" in text, text
    assert not (tmp_path / "bundle" / "model.fp32.onnx").exists()


def test_a_declared_anchor_table_travels_with_the_eval_data(mediapipe_models: dict[str, Path],
                                                            blazeface_photos: dict[str, Any]) -> None:
    """``anchors`` [N, 4] in the eval .npz is read beside the inputs and labels and decodes the boxes; a
    table that does not fit the model's anchors is refused with a plain message."""
    from toolkit.conversion import calibration
    from toolkit.errors import UsageError
    from toolkit.runtimes.execution import open_session
    from toolkit.verification import detection
    from toolkit.verification.outputs import verify_outputs
    from toolkit.model.tolerance import Tolerance

    rows = detection.SCHEMES[(896, 16)].table().rows
    work = blazeface_photos["work"]
    np.savez(work / "declared.npz", input=blazeface_photos["images"], y=blazeface_photos["labels"], anchors=rows)
    session = open_session(mediapipe_models["face_detection"], threads=2)
    try:
        data = calibration.read_data(work / "declared.npz", session.inputs, what="eval data")
        outputs = [session.run({"input": image[None]}) for image in data.arrays["input"]]
        names = [o.name for o in session.outputs]
    finally:
        session.close()
    assert data.anchors is not None and data.anchors.shape == (896, 4) and list(data.arrays) == ["input"]
    v = verify_outputs(outputs, outputs, tolerance=Tolerance(), labels=data.labels, anchors=data.anchors,
                       output_names=names).verification
    assert v.task_metrics["anchors"].startswith("declared") and v.task_metrics["reference_label_recall"] == 1.0
    shifted = rows.copy()
    shifted[:, 0] += 40.0  # every box 40 px off: no labelled face is found where it is
    v = verify_outputs(outputs, outputs, tolerance=Tolerance(), labels=data.labels, anchors=shifted,
                       output_names=names).verification
    assert v.task_metrics["reference_label_recall"] < 0.2
    with pytest.raises(UsageError, match=r"anchors array is \[10, 4\]; the model has 896"):
        verify_outputs(outputs, outputs, tolerance=Tolerance(), labels=data.labels, anchors=rows[:10],
                       output_names=names)
