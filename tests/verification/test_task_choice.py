"""Where the task comes from: --task, else the eval data's dataset.toml, else the float outputs (recorded)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.fixtures.real_models import Detector, shapes_images
from toolkit import api
from toolkit.errors import UsageError


def _image_folder(path: Path, task: str) -> Path:
    path.mkdir()
    images, _ = shapes_images(20, seed=3)
    for i, image in enumerate(images):
        Image.fromarray((image * 255).round().astype(np.uint8)).save(path / f"{i:03d}.png")
    (path / "dataset.toml").write_text(f'size = [64, 64]\nscale = 0.00392156862745098\ntask = "{task}"\n')
    return path


def _record(source: Path, out: Path, **options) -> dict:
    api.convert(source, out=out, precisions=["fp32"], formats=["tflite"], use_cache=False,
                progress=lambda message: None, **options)
    return json.loads((out / "manifest.json").read_text())["artifacts"][0]["verification"]


def test_dataset_toml_names_the_task(yolo_detector: Detector, tmp_path: Path) -> None:
    folder = _image_folder(tmp_path / "eval", "detection")
    v = _record(yolo_detector.model, tmp_path / "bundle", eval_data=folder)
    assert v["task"] == "detection" and v["task_source"] == "dataset.toml"
    assert v["task_metrics"]["recall"] == 1.0 and v["task_metrics"]["float_detections"] >= 10


def test_task_flag_wins_and_a_task_that_does_not_fit_is_not_a_verdict(yolo_detector: Detector, tmp_path: Path) -> None:
    folder = _image_folder(tmp_path / "eval", "detection")
    v = _record(yolo_detector.model, tmp_path / "bundle", eval_data=folder, task="segmentation")
    assert v["task"] == "segmentation" and v["task_source"] == "--task"
    assert "--task segmentation, but the first output" in v["vacuous"]


def test_a_misspelt_task_in_dataset_toml_is_refused(yolo_detector: Detector, tmp_path: Path) -> None:
    folder = _image_folder(tmp_path / "eval", "detectoin")
    with pytest.raises(UsageError) as raised:
        _record(yolo_detector.model, tmp_path / "bundle", eval_data=folder)
    assert "task" in raised.value.message and "detection" in (raised.value.message + (raised.value.hint or ""))
