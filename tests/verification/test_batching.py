"""``convert --dynamic-batch``: each artifact with a dynamic batch is run at batch 4 and 8 on the host, and each
sample's outputs are compared with its own batch-1 outputs; the result is in the manifest, and an artifact whose
samples change with their batch-mates is not ``ok``.

Real conversions (a small PyTorch MLP factory -> ONNX through torch.onnx, onnxruntime on the host): a plain
model whose fp32 artifact batches exactly, and one that honestly mixes samples across the batch dimension
(each row gets half the batch mean of the features added, as a BatchNorm in training mode would). Random
weights: nothing is claimed about accuracy here, only about batching."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

NETS = '''
import torch


class Net(torch.nn.Module):
    def __init__(self, mix=False):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
        self.mix = mix

    def forward(self, x):
        y = self.body(x)
        return y + 0.5 * y.mean(dim=0, keepdim=True) if self.mix else y


def make_model():
    return Net().eval()


def make_mixing():
    return Net(mix=True).eval()
'''


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    work = tmp_path_factory.mktemp("batching")
    (work / "nets.py").write_text(NETS)
    np.savez(work / "calib.npz", x=np.random.default_rng(0).standard_normal((40, 16)).astype(np.float32))
    return work


def _convert(nets: Path, factory: str, precisions: list[str]) -> Any:
    import toolkit

    return toolkit.convert(f"{nets / 'nets.py'}:{factory}", calibration=str(nets / "calib.npz"), dynamic_batch=True,
                           formats=["onnx"], precisions=precisions, out=str(nets / f"bundle-{factory}"), force=True,
                           input_shapes={"x": (1, 16)})


def test_a_dynamic_batch_artifact_is_verified_per_sample_at_batch_4_and_8(nets: Path) -> None:
    from toolkit.delivery.bundle import read_bundle

    result = _convert(nets, "make_model", ["fp32", "dynamic"])
    by_file = {a.file: a for a in result.manifest.artifacts}
    fp32 = by_file["model.fp32.onnx"]
    assert fp32.inputs[0].shape[0] is None and fp32.batching is not None
    assert [c.batch for c in fp32.batching.checks] == [4, 8]
    assert fp32.batching.ok and all(c.max_abs_error <= c.limit for c in fp32.batching.checks)
    assert fp32.status == "ok"
    # ONNX Runtime's dynamic INT8 (DynamicQuantizeLinear) takes each activation's scale over the whole batch,
    # so a sample's outputs move with its batch-mates: measured, written down, and the artifact is not ok.
    dynamic = by_file["model.dynamic.onnx"]
    assert dynamic.batching is not None and not dynamic.batching.ok
    assert dynamic.status != "ok"
    attempt = next(a for a in result.manifest.attempts if a.file == "model.dynamic.onnx")
    assert "batching changes each sample's result" in attempt.reason
    # the record travels in manifest.json and reads back through the schema
    written = json.loads((result.bundle_dir / "manifest.json").read_text())
    record = next(a for a in written["artifacts"] if a["file"] == "model.fp32.onnx")["batching"]
    assert record["ok"] is True and [c["batch"] for c in record["checks"]] == [4, 8]
    again = {a.file: a for a in read_bundle(result.bundle_dir).manifest.artifacts}
    assert again["model.fp32.onnx"].batching == fp32.batching
    assert again["model.dynamic.onnx"].batching == dynamic.batching


def test_an_artifact_that_mixes_samples_across_the_batch_is_not_ok(nets: Path) -> None:
    result = _convert(nets, "make_mixing", ["fp32"])
    (artifact,) = result.manifest.artifacts
    assert artifact.batching is not None and not artifact.batching.ok
    assert all(c.max_abs_error > 10 * c.limit for c in artifact.batching.checks), artifact.batching
    assert artifact.status == "out_of_tolerance"
    assert not artifact.preferred


def test_an_output_without_its_batch_dimension_is_named() -> None:
    """The comparison itself on plain numpy: an output that sums over the batch cannot be split per sample."""
    from toolkit.model.batching import verify_batches

    feeds = [{"x": np.full((1, 3), float(i), np.float32)} for i in range(3)]
    single = [[np.asarray(f["x"].sum(keepdims=True))] for f in feeds]
    verdict = verify_batches(lambda feed: [np.asarray(feed["x"].sum(keepdims=True).reshape(1))], feeds, single,
                             output_names=["total"])
    assert not verdict.ok and verdict.problem is not None
    assert "output 'total' has shape [1] at batch 4" in verdict.problem
    exact = verify_batches(lambda feed: [feed["x"] * 2.0], feeds, [[f["x"] * 2.0] for f in feeds],
                           output_names=["double"])
    assert exact.ok and [c.max_abs_error for c in exact.checks] == [0.0, 0.0]
