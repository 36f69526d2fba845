"""A trained YOLO-style detector whose plain INT8 artifact has a collapsed score channel.

The detector (tests/fixtures/real_models.py) is trained here on synthetic shapes; its head's final Concat
mixes box coordinates (0-320) and class scores (0-1), so full INT8 with one scale for that tensor rounds every
score to 0 or ~1.26. Asked for explicitly, the artifact still ships (marked), which lets the test read what
the verification recorded and what the on-device golden check says about it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.real_models import Detector, assert_detects_drawn_shapes
from toolkit import api
from toolkit.verification import detection
from tests.fixtures.runner_output import report_doc


@pytest.fixture(scope="module")
def detector_bundle(yolo_detector: Detector, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("bundles")
    out = work / "detector"
    # the eval images with their drawn boxes as labels: y [samples, K, 5] (class, cx, cy, w, h), class -1 pads
    boxes = yolo_detector.eval_boxes
    labels = np.full((len(boxes), max(len(b) for b in boxes), 5), -1.0, np.float32)
    for i, b in enumerate(boxes):
        labels[i, :len(b)] = b
    np.savez(work / "eval.npz", x=np.load(yolo_detector.eval_data)["x"], y=labels)
    from toolkit.conversion.tflite import convert as tflite

    with pytest.MonkeyPatch.context() as patch:  # the fragile-Concat rule off: this bundle shows plain INT8
        patch.setattr(tflite, "_has_output_concat", lambda model: False)
        api.convert(yolo_detector.model, calibration=yolo_detector.calibration, eval_data=work / "eval.npz",
                    precisions=["fp32", "int8"], formats=["tflite"], out=out, use_cache=False,
                    progress=lambda message: None)
    manifest = json.loads((out / "manifest.json").read_text())
    return {"dir": out, "manifest": manifest,
            "by_precision": {a["precision"]: a for a in manifest["artifacts"]}}


def test_the_float_detector_is_trained(yolo_detector: Detector) -> None:
    """Recall and precision of the float model against the drawn shapes (IoU 0.5, score > 0.25): the metric
    below judges a real detector, not noise."""
    import keras

    model = keras.saving.load_model(yolo_detector.model, compile=False)
    images = np.load(yolo_detector.eval_data)["x"]
    assert_detects_drawn_shapes(np.asarray(model.predict(images, verbose=0)), yolo_detector.eval_boxes)


def test_collapsed_score_channel_is_caught_though_cosine_passes(detector_bundle: dict[str, Any]) -> None:
    int8 = detector_bundle["by_precision"]["int8"]
    v = int8["verification"]
    assert v["task"] == "detection" and v["task_source"].startswith("inferred")
    # the whole-tensor numbers say nothing is wrong ...
    assert v["cosine_similarity"] > 0.99
    # ... the detection metric and the score slice see the collapse
    metrics = v["task_metrics"]
    assert metrics["layout"] == "yolo" and metrics["float_detections"] >= 60
    assert metrics["recall"] < 0.8, metrics
    assert int8["status"] == "out_of_tolerance"
    (output,) = v["outputs"]
    boxes, scores = output["slices"]
    assert boxes["runs"] == [[0, 4]] and boxes["float_range"] > 250
    assert scores["runs"][0][0] == 4 and scores["float_range"] <= 1.0
    assert scores["max_error_ratio"] > 0.25 > boxes["max_error_ratio"]
    assert scores["name"] in v["worst"]
    # against the drawn boxes too: the float model's recall as measured independently above, the INT8's lower,
    # by more than the label tolerance (5 points below the float model's own score): that gates as well
    assert metrics["labelled_boxes"] >= 80
    assert metrics["reference_label_recall"] >= 0.75
    assert metrics["label_recall"] < metrics["reference_label_recall"] - 0.1
    kept = [a for a in detector_bundle["manifest"]["attempts"] if a.get("file") == int8["file"]]
    assert any("detection recall vs float" in a["reason"] for a in kept), kept
    assert any("detection recall vs the labels" in a["reason"] for a in kept), kept


def test_fp32_artifact_matches_the_float_detector(detector_bundle: dict[str, Any]) -> None:
    fp32 = detector_bundle["by_precision"]["fp32"]
    metrics = fp32["verification"]["task_metrics"]
    assert metrics["recall"] == 1.0 and metrics["precision"] == 1.0
    assert metrics["label_recall"] == metrics["reference_label_recall"]
    assert metrics["label_precision"] == metrics["reference_label_precision"]
    assert fp32["status"] in ("ok", "slower")  # the label gate passes the artifact that lost nothing
    assert fp32["verification"]["vacuous"] is None


def test_golden_check_fails_the_collapsed_detector_on_the_device(detector_bundle: dict[str, Any], device_env) -> None:
    """The runner, in a device env (numpy + runtimes, no TensorFlow), compares each slice the manifest lists
    with the float reference: the int8 artifact matches its own host outputs, yet its score slice fails."""
    bundle: Path = detector_bundle["dir"]
    int8 = detector_bundle["by_precision"]["int8"]
    assert int8["golden"]["slices"] and int8["golden"]["reference"]
    proc = subprocess.run([str(device_env.python), str(bundle / "edgetk_runner.py"), "check", "--bundle", str(bundle),
                           "--runs", "3", "--warmup", "1"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reports = {r["artifact"]: r for r in report_doc(proc.stdout)["reports"]}
    bad = reports[int8["file"]]["outputs_match"]
    good = reports[detector_bundle["by_precision"]["fp32"]["file"]]["outputs_match"]
    assert good["ok"] is True and all(s["ok"] for s in good["slices"])
    assert bad["ok"] is False
    worst = max(bad["slices"], key=lambda s: s["max_error_ratio"])
    assert worst["name"].endswith("4:6, :]") or "4" in worst["name"]
    assert worst["max_error_ratio"] > worst["limit"]


def test_label_gate_limits_the_drop_from_the_float_models_own_score() -> None:
    """The label gate compares the artifact with the float model against the same boxes: a drop within
    max_label_recall_drop passes, one beyond it fails, and too few labelled boxes gate nothing."""
    from toolkit.model.artifact import Verification
    from toolkit.verification.verdict import failures_of
    from toolkit.model.tolerance import Tolerance

    def record(own: float, boxes: int) -> Verification:
        return Verification(max_abs_error=0.0, mean_abs_error=0.0, cosine_similarity=1.0, top1_agreement=None,
                            samples=20, task="detection", task_metrics={
                                "labelled_boxes": boxes, "reference_label_recall": 0.9, "label_recall": own,
                                "reference_label_precision": 0.8, "label_precision": 0.8})

    tolerance = Tolerance(max_label_recall_drop=0.05)
    assert failures_of(record(0.86, 40), tolerance) == []
    (reason,) = failures_of(record(0.80, 40), tolerance)
    assert "recall vs the labels 0.800, the float model's 0.900" in reason and "10.0 points > 5.0" in reason
    assert failures_of(record(0.10, detection.MIN_DETECTIONS - 1), tolerance) == []
    assert failures_of(record(0.80, 40), Tolerance(max_label_recall_drop=0.2)) == []
