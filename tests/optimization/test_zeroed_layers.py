"""Regression: global pruning can zero a whole kernel (a layer whose weights are all smaller than the global
threshold; MobileNetV2 at 50% has such layers), and clustering after it must keep that kernel as it is instead of
running k-means on nothing (it crashed with ``zero-size array to reduction operation minimum``). Tiny untrained
models (one layer scaled down by 1e-6 so the global threshold takes all of it), so the tests run in seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.optimization import optimize

TORCH_CODE = '''
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(256, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


def make_model():
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        model.conv2.weight.mul_(1e-6)  # every weight below the global 50% magnitude threshold
    return model.eval()
'''


def _check(report, kernels: dict[str, np.ndarray], zeroed: str) -> None:  # type: ignore[no-untyped-def]
    prune_step, cluster_step = report.steps
    assert prune_step.details["layers"][zeroed] == 1.0  # the whole kernel pruned away
    assert cluster_step.details["left_as_is"] == [zeroed]
    assert not kernels[zeroed].any()
    for name, kernel in kernels.items():
        assert np.unique(kernel).size <= 16, name
    total = sum(k.size for k in kernels.values())
    assert sum(int((k == 0).sum()) for k in kernels.values()) / total >= 0.5  # zeros survive clustering


def test_keras_cluster_after_global_prune_zeroed_a_layer(tmp_path: Path) -> None:
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv1")(inputs)
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv2")(x)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(10, name="fc")(x)
    model = keras.Model(inputs, outputs)
    conv2 = model.get_layer("conv2")
    conv2.kernel.assign(np.asarray(conv2.kernel) * 1e-6)
    source = tmp_path / "tiny.keras"
    model.save(source)
    data = tmp_path / "x.npz"
    np.savez(data, image=np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32))

    out = tmp_path / "out.keras"
    report = optimize(source, prune=0.5, cluster=16, eval_data=data, out=out)
    loaded = keras.saving.load_model(out)
    kernels = {f"{l.name}/kernel": np.asarray(l.kernel) for l in loaded.layers if hasattr(l, "kernel")}
    _check(report, kernels, "conv2/kernel")


def test_torch_cluster_after_global_prune_zeroed_a_layer(tmp_path: Path) -> None:
    import torch

    code = tmp_path / "tiny_torch.py"
    code.write_text(TORCH_CODE)
    data = tmp_path / "x.npz"
    np.savez(data, x=np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32))

    out = tmp_path / "out.pt"
    report = optimize(f"{code}:make_model", prune=0.5, cluster=16, eval_data=data, out=out)
    module = torch.jit.load(str(out))
    kernels = {n: p.detach().numpy() for n, p in module.named_parameters() if n.endswith("weight")}
    _check(report, kernels, "conv2.weight")
