"""Structured pruning of a Keras 3 model with an inverted residual block (MobileNetV2's pattern, tiny and
untrained so the test runs in seconds): the expansion/depthwise channels inside the block are removed, the
channels that feed the residual Add stay. The channels that get removed are made dead on purpose (zero filters),
so the pruned model must compute exactly what the original did: that checks every slice (expansion filters, its
BatchNorm, the depthwise filters and their BatchNorm, the projection's input rows, a hidden Dense after global
pooling)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.optimization import optimize


def _residual_model(path: Path) -> None:
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 1), name="image")
    stem = keras.layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
    stem = keras.layers.BatchNormalization(name="stem_bn")(stem)
    stem = keras.layers.ReLU(6.0, name="stem_relu")(stem)
    x = keras.layers.Conv2D(16, 1, name="expand")(stem)
    x = keras.layers.BatchNormalization(name="expand_bn")(x)
    x = keras.layers.ReLU(6.0, name="expand_relu")(x)
    x = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(x)
    x = keras.layers.BatchNormalization(name="dw_bn")(x)
    x = keras.layers.ReLU(6.0, name="dw_relu")(x)
    x = keras.layers.Conv2D(8, 1, name="project")(x)
    x = keras.layers.BatchNormalization(name="project_bn")(x)
    x = keras.layers.Add(name="add")([stem, x])
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    x = keras.layers.Dense(32, activation="relu", name="hidden")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="classifier")(x)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(0)
    for name, count, units in (("expand", 16, 8), ("hidden", 32, 16)):
        layer = model.get_layer(name)
        kernel = np.asarray(layer.kernel)
        dead = rng.choice(count, units, replace=False)  # these channels output 0 whatever the input
        kernel[..., dead] = 0.0
        layer.kernel.assign(kernel)
    for bn in ("stem_bn", "expand_bn", "dw_bn", "project_bn"):  # non-trivial statistics, dead channels stay 0
        layer = model.get_layer(bn)
        channels = layer.gamma.shape[0]
        layer.gamma.assign(rng.uniform(0.5, 1.5, channels).astype(np.float32))
        layer.moving_variance.assign(rng.uniform(0.5, 2.0, channels).astype(np.float32))
    model.save(path)


def test_keras_structured_prune_keeps_residual_channels(tmp_path: Path) -> None:
    import keras

    source = tmp_path / "residual.keras"
    _residual_model(source)
    data = tmp_path / "x.npz"
    x = np.random.default_rng(2).random((16, 8, 8, 1), dtype=np.float32)
    np.savez(data, image=x)
    out = tmp_path / "pruned.keras"
    report = optimize(source, prune=0.5, structured=True, eval_data=data, out=out)

    details = report.steps[0].details
    assert details["channels"] == {"expand": [16, 8], "hidden": [32, 16]}
    assert set(details["left_whole"]) == {"stem", "project", "classifier"}
    assert "Add" in details["left_whole"]["stem"] and "Add" in details["left_whole"]["project"]
    assert "output" in details["left_whole"]["classifier"]

    original = keras.saving.load_model(source)
    pruned = keras.saving.load_model(out)  # plain load: built-in layers only
    assert pruned.get_layer("expand").filters == 8
    assert tuple(pruned.get_layer("dw").kernel.shape) == (3, 3, 8, 1)
    assert tuple(pruned.get_layer("dw_bn").gamma.shape) == (8,)
    assert tuple(pruned.get_layer("project").kernel.shape) == (1, 1, 8, 8)
    assert pruned.get_layer("stem").filters == 8  # feeds the Add: untouched
    assert tuple(pruned.get_layer("classifier").kernel.shape) == (16, 10)
    # only dead channels were removed, so the function is the same
    np.testing.assert_allclose(pruned.predict(x, verbose=0), original.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert report.final.params < report.baseline.params
    assert report.final.macs < report.baseline.macs * 0.75
