"""--metric is the judge of the outputs it covers: the tensor statistics are recorded, not gated, for them.

The trained digits CNN's INT8 TFLite under a profile whose tensor limits it breaks (cosine 0.999999): the
user's metric (accuracy against the labels within 2 points of the float model's) accepts it and it ships
``ok``; a metric that asks for the float logits to within 1e-4 refuses it, and the reason names the metric.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit import api

METRIC = '''
import numpy as np

def accuracy_kept(reference, artifact, labels):
    """The artifact's accuracy against the labels within 2 points of the float model's."""
    ref = float(np.mean(reference[0].reshape(len(labels), -1).argmax(-1) == labels))
    act = float(np.mean(artifact[0].reshape(len(labels), -1).argmax(-1) == labels))
    return {"accuracy": act, "reference_accuracy": ref, "ok": ref - act <= 0.02}

def logits_exact(reference, artifact, labels):
    gap = float(np.max(np.abs(reference[0] - artifact[0])))
    return {"max_logit_gap": gap, "ok": gap < 1e-4}
'''


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A profile whose cosine limit a plain INT8 breaks, and the metric file."""
    root = tmp_path_factory.mktemp("judge")
    (root / "profiles").mkdir()
    (root / "profiles" / "strict.toml").write_text('extends = "generic-x86_64"\n[tolerance]\nmin_cosine = 0.999999\n'
                                                   'max_top1_drop = 0.0\n')
    (root / "metric.py").write_text(METRIC)
    return root / "profiles", root / "metric.py"


def _convert(source: Path, eval_data: Path, out: Path, profiles: Path, metric: str,
             precisions: tuple[str, ...] = ("int8",)) -> dict:
    api.convert(source, out=out, target="strict", targets_dirs=[profiles], precisions=list(precisions), formats=["tflite"],
                eval_data=eval_data, calibration=eval_data, metric=metric, use_cache=False,
                progress=lambda message: None)
    return json.loads((out / "manifest.json").read_text())


def test_the_metric_accepts_what_the_tensor_gates_refuse(digits_keras: Path, digits_eval: Path, tmp_path: Path,
                                                         strict: tuple[Path, Path]) -> None:
    profiles, metric = strict
    manifest = _convert(digits_keras, digits_eval, tmp_path / "b", profiles, f"{metric}:accuracy_kept")
    (record,) = [a for a in manifest["artifacts"] if a["precision"] == "int8"]
    v = record["verification"]
    assert v["cosine_similarity"] < 0.999999  # recorded as information: this limit alone would drop it
    assert v["user_metric"]["ok"] is True and v["user_metric"]["covers"] == [o["name"] for o in v["outputs"]]
    assert v["user_metric"]["values"]["reference_accuracy"] - v["user_metric"]["values"]["accuracy"] <= 0.02
    assert record["status"] in ("ok", "no_speedup_measured", "slower"), record["status"]


def test_the_metric_refuses_and_is_named(digits_keras: Path, digits_eval: Path, tmp_path: Path,
                                         strict: tuple[Path, Path]) -> None:
    profiles, metric = strict
    manifest = _convert(digits_keras, digits_eval, tmp_path / "b", profiles, f"{metric}:logits_exact")
    (attempt,) = manifest["attempts"]
    (record,) = manifest["artifacts"]
    assert record["status"] == "out_of_tolerance"  # asked for alone: shipped but marked, never preferred
    assert f"--metric {metric}:logits_exact says not ok (max_logit_gap" in attempt["reason"], attempt["reason"]
    assert "cosine" not in attempt["reason"], attempt["reason"]  # the tensor gates do not speak for its outputs
