"""Outputs that are neither classes nor maps, on two small models trained here (tests/fixtures/ordinal_models.py):
a pitch estimator's 48-bin sigmoid histogram (ordinal: decoded by the weighted mean around the peak) and a
quality regressor's three scores without softmax (regression: each component against its own spread, never
argmax). Each one's plain INT8 TFLite is kept on its decoded metric, and a copy whose head's int8 weight
scales are written 1000x too small (the artifact runs, its head collapses) is refused by the same metric.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.ordinal_models import BIN_CENTS, pitch_estimator, quality_regressor  # noqa: F401 - fixtures
from tests.fixtures.role_models import RoleModel, collapse_head, float_outputs, run_artifact
from toolkit import api
from toolkit.model.roles import parse_output_tasks
from toolkit.model.tasks import TaskChoice
from toolkit.model.tolerance import Tolerance
from toolkit.verification import ordinal
from toolkit.verification.outputs import verify_outputs


def _bundle(model: RoleModel, out: Path) -> dict[str, Any]:
    api.convert(model.model, out=out, precisions=["fp32", "int8"], formats=["tflite"],
                calibration=model.calibration, eval_data=model.eval, use_cache=False, progress=lambda message: None)
    return json.loads((out / "manifest.json").read_text())


def _int8(manifest: dict[str, Any]) -> dict[str, Any]:
    return next(a for a in manifest["artifacts"] if a["precision"] == "int8")


@pytest.fixture(scope="module")
def pitch_bundle(pitch_estimator: RoleModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("pitch") / "bundle"
    return out, _bundle(pitch_estimator, out)


@pytest.fixture(scope="module")
def quality_bundle(quality_regressor: RoleModel,
                   tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("quality") / "bundle"
    return out, _bundle(quality_regressor, out)


def _outputs(model: RoleModel, bundle: Path, record: dict[str, Any], tmp_path: Path, head: str | None = None):  # type: ignore[no-untyped-def]
    path = bundle / record["file"]
    if head is not None:
        path = collapse_head(path, head, tmp_path / f"broken-{record['file']}")
    return float_outputs(model.model, model.x_eval), run_artifact(path, model.x_eval, record)


def test_the_pitch_histogram_is_ordinal_and_its_int8_is_kept(pitch_bundle: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = pitch_bundle
    record = _int8(manifest)
    v = record["verification"]
    (out,) = v["outputs"]
    assert out["role"] == "ordinal" and out["role_source"].startswith("inferred: 48 ordered bins"), out
    assert v["task"] == "per-output", v["task_source"]
    m = out["metrics"]
    assert m["decoded_error_bins_p95"] <= Tolerance().max_ordinal_error and m["confident_rows"] >= 100, m
    assert record["status"] in ("ok", "slower", "no_speedup_measured"), (record["status"], v)
    assert "top1_agreement" not in v["task_metrics"]  # never judged as 48 classes


def test_a_broken_pitch_head_is_refused(pitch_estimator: RoleModel, pitch_bundle: tuple[Path, dict[str, Any]],
                                        tmp_path: Path) -> None:
    bundle, manifest = pitch_bundle
    reference, broken = _outputs(pitch_estimator, bundle, _int8(manifest), tmp_path, head="pitch")
    verdict = verify_outputs(reference, broken, tolerance=Tolerance(), output_names=["pitch"])
    (out,) = verdict.verification.outputs
    assert out.metrics["decoded_error_bins_p95"] > 2.0, out.metrics
    assert any(f.startswith("pitch (ordinal): decoded value's error in bins") for f in verdict.failures), \
        verdict.failures


def test_declared_bin_width_reports_cents(pitch_estimator: RoleModel, pitch_bundle: tuple[Path, dict[str, Any]],
                                          tmp_path: Path) -> None:
    bundle, manifest = pitch_bundle
    reference, artifact = _outputs(pitch_estimator, bundle, _int8(manifest), tmp_path)
    declared = parse_output_tasks([f"pitch=ordinal,bin={BIN_CENTS},unit=cents"])
    verdict = verify_outputs(reference, artifact, tolerance=Tolerance(), output_names=["pitch"],
                             task=TaskChoice(None, "--output-task", declared))
    (out,) = verdict.verification.outputs
    assert out.role_source == "--output-task" and verdict.ok, verdict.failures
    assert out.metrics["decoded_error_cents_p95"] == pytest.approx(out.metrics["decoded_error_bins_p95"] * BIN_CENTS)


def test_an_ordinal_output_read_as_classes_names_the_role_that_passes(
        pitch_estimator: RoleModel, pitch_bundle: tuple[Path, dict[str, Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A histogram whose shape inference does not recognise (simulated: the evidence threshold set out of
    reach) is read as 48 classes; where it fails top-1 bin agreement alone, the reason says it passes as
    ordinal and what to declare."""
    bundle, manifest = pitch_bundle
    reference, artifact = _outputs(pitch_estimator, bundle, _int8(manifest), tmp_path)
    monkeypatch.setattr(ordinal, "ADJACENT_SHARE", 1.01)
    verdict = verify_outputs(reference, artifact, tolerance=Tolerance(), output_names=["pitch"])
    (out,) = verdict.verification.outputs
    assert out.role == "classification" and out.metrics["would_pass_as"] == "ordinal", out
    assert any("as ordinal this output passes: if it carries ordinal values, declare --output-task pitch=ordinal"
               in f for f in verdict.failures), verdict.failures


def test_three_scores_are_regression_and_their_int8_is_kept(quality_bundle: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = quality_bundle
    record = _int8(manifest)
    v = record["verification"]
    (out,) = v["outputs"]
    assert out["role"] == "regression" and "move together" in out["role_source"], out
    assert v["task"] == "per-output" and "top1_agreement" not in v["task_metrics"], v
    assert out["metrics"]["component_error_to_spread"] <= Tolerance().max_relative_error, out["metrics"]
    assert record["status"] in ("ok", "slower", "no_speedup_measured"), (record["status"], v)


def test_a_broken_score_head_is_refused(quality_regressor: RoleModel, quality_bundle: tuple[Path, dict[str, Any]],
                                        tmp_path: Path) -> None:
    bundle, manifest = quality_bundle
    reference, broken = _outputs(quality_regressor, bundle, _int8(manifest), tmp_path, head="scores")
    verdict = verify_outputs(reference, broken, tolerance=Tolerance(), output_names=["scores"])
    (out,) = verdict.verification.outputs
    assert out.metrics["component_error_to_spread"] > 0.5, out.metrics
    assert any(f.startswith("scores (regression): worst component's RMS error against its spread")
               for f in verdict.failures), verdict.failures
    print("broken scores", out.metrics, np.round(out.cosine_similarity, 4))
