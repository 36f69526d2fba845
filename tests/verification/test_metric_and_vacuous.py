"""A user's --metric gates like the built-in limits; a verdict that proves nothing is refused (unverified)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.cli import assert_clean_error, run_edgetk_inproc
from toolkit import api

METRIC = '''
import numpy as np

def margin(reference, artifact, labels):
    """Mean absolute gap between the float and the artifact's top logit, per sample."""
    ref, act = reference[0], artifact[0]
    gap = float(np.mean(np.abs(ref.max(axis=-1) - act.max(axis=-1))))
    return {"top_logit_gap": gap, "samples": len(ref), "labels": 0 if labels is None else len(labels),
            "ok": gap <= LIMIT}
'''


def _convert(source: Path, out: Path, **options) -> dict:
    api.convert(source, out=out, precisions=["fp32"], formats=["tflite"], use_cache=False,
                progress=lambda message: None, **options)
    return json.loads((out / "manifest.json").read_text())["artifacts"][0]


@pytest.mark.parametrize("limit, ok", [(1.0, True), (-1.0, False)])
def test_user_metric_is_recorded_and_gates(digits_keras: Path, digits_eval: Path, tmp_path: Path,
                                           limit: float, ok: bool) -> None:
    metric = tmp_path / "metric.py"
    metric.write_text(f"LIMIT = {limit}\n" + METRIC)
    record = _convert(digits_keras, tmp_path / "bundle", eval_data=digits_eval, metric=f"{metric}:margin")
    user = record["verification"]["user_metric"]
    assert user["metric"] == f"{metric}:margin" and user["ok"] is ok
    assert user["values"]["samples"] == 497 and user["values"]["labels"] == 497
    assert 0 <= user["values"]["top_logit_gap"] < 1e-3  # fp32 TFLite vs Keras
    assert (record["status"] == "out_of_tolerance") is (not ok)


def test_a_bad_metric_spec_is_a_usage_error(digits_keras: Path, tmp_path: Path) -> None:
    result = run_edgetk_inproc("convert", digits_keras, "--metric", str(tmp_path / "missing.py:fn"), "--out",
                               tmp_path / "b", "--precision", "fp32", "--format", "tflite")
    assert_clean_error(result, 2, "--metric", "not a Python file")


def test_outputs_that_do_not_vary_are_not_verified(digits_eval: Path, tmp_path: Path) -> None:
    """A model whose output ignores its input: every artifact matches it, which proves nothing."""
    import keras

    inp = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Flatten()(inp)
    out = keras.layers.Dense(10, kernel_initializer="zeros", bias_initializer="ones")(x)
    path = tmp_path / "constant.keras"
    keras.Model(inp, out).save(path)
    record = _convert(path, tmp_path / "bundle", eval_data=digits_eval)
    v = record["verification"]
    assert v["max_abs_error"] == 0.0 and v["cosine_similarity"] == pytest.approx(1.0)
    assert "same outputs for every eval input" in v["vacuous"]
    assert record["status"] == "unverified"
    (attempt,) = json.loads((tmp_path / "bundle" / "manifest.json").read_text())["attempts"]
    assert attempt["outcome"] == "kept" and attempt["reason"] == f"asked for; shipped unverified: {v['vacuous']}"


def test_too_few_eval_samples_are_not_a_verdict(digits_keras: Path, tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    images = (load_digits().images[:3].astype(np.float32) / 16.0)[..., None]
    np.savez(tmp_path / "three.npz", image=images)
    record = _convert(digits_keras, tmp_path / "bundle", eval_data=tmp_path / "three.npz")
    assert "only 3 eval sample(s)" in record["verification"]["vacuous"]
    assert record["status"] == "unverified"


def test_an_fp32_out_of_tolerance_gets_its_own_workaround(digits_keras: Path, digits_eval: Path,
                                                          tmp_path: Path) -> None:
    """A profile stricter than float rounding (cosine 1.0) drops even fp32: the error names an fp32 workaround,
    not "the profile's next recipe ships instead" (nothing else can)."""
    from toolkit.errors import ConversionError

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "strict.toml").write_text('extends = "generic-x86_64"\n[tolerance]\nmin_cosine = 1.0\n')
    with pytest.raises(ConversionError) as caught:
        api.convert(digits_keras, out=tmp_path / "bundle", target="strict", targets_dirs=[profiles],
                    formats=["tflite"], eval_data=digits_eval, use_cache=False, progress=lambda message: None)
    message = caught.value.message
    assert "tflite fp32: cosine similarity" in message and "an fp32 artifact should match its source" in message
    assert "next recipe ships instead" not in message.split("tflite fp32:")[1].split("\n")[0], message
    assert not (tmp_path / "bundle").exists()
