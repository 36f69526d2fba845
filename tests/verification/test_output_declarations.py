"""Roles declared per output: dataset.toml's ``[outputs.NAME]``, ``--output-task NAME=TASK`` (which wins),
wrong names and roles refused with the nearest one; the trained face stage (tests/fixtures/role_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.fixtures.cli import assert_clean_error, run_edgetk_inproc
from tests.fixtures.role_models import RoleModel
from toolkit import api
from toolkit.errors import UsageError
from toolkit.model.roles import Role, parse_output_tasks


def _face_folder(model: RoleModel, path: Path, outputs: str) -> Path:
    path.mkdir()
    for i, image in enumerate(model.x_eval[:40]):
        Image.fromarray((image[..., 0] * 255).round().astype(np.uint8), mode="L").save(path / f"{i:03d}.png")
    (path / "dataset.toml").write_text(f'color_order = "GRAY"\nscale = 0.00392156862745098\n{outputs}')
    return path


def _outputs(source: Path, out: Path, **options) -> dict[str, dict]:  # type: ignore[no-untyped-def,type-arg]
    api.convert(source, out=out, precisions=["fp32"], formats=["tflite"], use_cache=False,
                progress=lambda message: None, **options)
    record = json.loads((out / "manifest.json").read_text())["artifacts"][0]["verification"]
    return {o["name"]: o for o in record["outputs"]}


def test_dataset_toml_declares_roles_and_the_flag_wins(face_stage: RoleModel, tmp_path: Path) -> None:
    folder = _face_folder(face_stage, tmp_path / "eval", '[outputs.offsets]\ntask = "regression"\n'
                                                         '[outputs.landmarks]\ntask = "keypoints"\n')
    outputs = _outputs(face_stage.model, tmp_path / "bundle", eval_data=folder,
                       output_tasks=["landmarks=regression"])
    assert (outputs["offsets"]["role"], outputs["offsets"]["role_source"]) == ("regression", "dataset.toml")
    assert (outputs["landmarks"]["role"], outputs["landmarks"]["role_source"]) == ("regression", "--output-task")
    assert outputs["face"]["role"] == "classification" and outputs["face"]["role_source"].startswith("inferred")
    assert outputs["offsets"]["metrics"]["relative_error"] < 1e-4


def test_a_wrong_output_name_is_refused_with_the_nearest_one(face_stage: RoleModel, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        _outputs(face_stage.model, tmp_path / "bundle", eval_data=face_stage.eval,
                 output_tasks=["landmark=landmarks"])
    assert "'landmark'" in raised.value.message and "did you mean 'landmarks'" in raised.value.message
    assert not (tmp_path / "bundle").exists()


def test_a_wrong_role_in_dataset_toml_is_refused(face_stage: RoleModel, tmp_path: Path) -> None:
    folder = _face_folder(face_stage, tmp_path / "eval", '[outputs.landmarks]\ntask = "landmark"\n')
    with pytest.raises(UsageError) as raised:
        _outputs(face_stage.model, tmp_path / "bundle", eval_data=folder)
    assert "task" in raised.value.message and "landmarks" in raised.value.message + (raised.value.hint or "")


def test_the_cli_flag_goes_through_the_option_machinery(face_stage: RoleModel, tmp_path: Path) -> None:
    result = run_edgetk_inproc("convert", face_stage.model, "--eval-data", face_stage.eval, "--precision", "fp32",
                               "--format", "tflite", "--out", tmp_path / "bundle", "--output-task",
                               "face=probabilty", "--no-cache")
    assert_clean_error(result, 2, "unknown output task 'probabilty'", "did you mean 'probabilities'")


def test_output_task_values_parse() -> None:
    chars, box = parse_output_tasks(["chars=ctc,blank=0", " offsets = box "])
    assert (chars.output, chars.role, chars.blank) == ("chars", Role.SEQUENCE, 0)
    assert (box.output, box.role, box.blank) == ("offsets", Role.BOXES, None)
    for bad in ("chars", "chars=", "chars=sequence,blank=x", "x=detection"):
        with pytest.raises(UsageError):
            parse_output_tasks([bad])
