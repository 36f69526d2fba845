"""Measure a model state: parameter counts, file and gzip size in the source's format, host latency, MACs,
accuracy. Each figure is measured on the real model, never estimated from the technique's settings."""

from __future__ import annotations

import gzip
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any  # Any: Keras/PyTorch objects (untyped frameworks, imported lazily)

import numpy as np

from toolkit.model.vocabulary import Framework
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.report import ModelFigures

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor, nn


def measure(model: models.OptimizableModel, *, sample: tuple[np.ndarray, ...] | None,
            eval_data: LabelledData | None, runs: int = 30) -> ModelFigures:
    params, nonzero = count_params(model)
    with tempfile.TemporaryDirectory(prefix="edgetk-opt-") as tmp:
        suffix = {Framework.KERAS: ".keras", Framework.EXPORTED_PROGRAM: ".pt2"}.get(model.kind, ".pt")
        path = Path(tmp) / f"model{suffix}"
        models.save(model, path)
        raw = path.read_bytes()
    accuracy = None
    if eval_data is not None and eval_data.labels is not None:
        accuracy = accuracy_of(model, eval_data)
    return ModelFigures(
        params=params,
        nonzero_params=nonzero,
        file_bytes=len(raw),
        gzip_bytes=len(gzip.compress(raw, compresslevel=9)),
        latency_ms=latency_ms(model, sample, runs=runs) if sample is not None else 0.0,
        macs=count_macs(model, sample) if sample is not None else 0,
        accuracy=accuracy,
    )


def accuracy_of(model: models.OptimizableModel, data: LabelledData) -> float:
    assert data.labels is not None
    outputs = models.predict(model, data.inputs)
    return round(float(np.mean(outputs.reshape(len(outputs), -1).argmax(-1) == data.labels)), 4)


def weights(model: models.OptimizableModel) -> list[np.ndarray]:
    if model.kind == Framework.KERAS:
        return [np.asarray(v) for v in model.model.weights]
    return [p.detach().cpu().numpy() for p in model.model.state_dict().values() if p.is_floating_point()]


def count_params(model: models.OptimizableModel) -> tuple[int, int]:
    arrays = weights(model)
    return int(sum(a.size for a in arrays)), int(sum(np.count_nonzero(a) for a in arrays))


def latency_ms(model: models.OptimizableModel, sample: tuple[np.ndarray, ...], *, runs: int = 30) -> float:
    """Median wall time of one inference on ``sample`` (batch of 1) after a few warm-up runs."""
    if model.kind == Framework.KERAS:
        import tensorflow as tf

        net = model.model
        fn = tf.function(lambda *xs: net(list(xs) if len(xs) > 1 else xs[0], training=False))
        args: tuple[Any, ...] = tuple(tf.constant(a) for a in sample)

        def call() -> None:
            fn(*args)
    else:
        import torch

        module = model.model
        targs = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in sample)

        def call() -> None:
            with torch.inference_mode():
                module(*targs)
    for _ in range(5):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000.0)
    return round(statistics.median(times), 4)


def count_macs(model: models.OptimizableModel, sample: tuple[np.ndarray, ...]) -> int:
    """Multiply-accumulates of conv and dense layers for one sample (the layers' own shapes, per sample)."""
    if model.kind == Framework.KERAS:
        return _keras_macs(model.model)
    return _torch_macs(model, sample)


def _keras_macs(net: Any) -> int:
    import keras

    total = 0
    for layer in keras_layers(net):
        if isinstance(layer, keras.layers.Dense):
            kernel = layer.kernel
            rows = int(np.prod([d for d in layer.output.shape[1:-1] if d is not None] or [1]))
            total += rows * int(kernel.shape[0]) * int(kernel.shape[1])
        elif isinstance(layer, (keras.layers.Conv2D, keras.layers.DepthwiseConv2D, keras.layers.Conv1D)):
            out_shape = [int(d) for d in layer.output.shape[1:]]
            kernel_shape = [int(d) for d in layer.kernel.shape]
            positions = int(np.prod(out_shape[:-1]))
            if isinstance(layer, keras.layers.DepthwiseConv2D):
                total += positions * int(np.prod(kernel_shape))
            else:
                total += positions * int(np.prod(kernel_shape[:-1])) * out_shape[-1] // max(1, getattr(layer, "groups", 1))
    return int(total)


def keras_layers(net: Any) -> list[Any]:
    """Every leaf layer of a Keras model, nested models opened (Any: Keras objects)."""
    import keras

    found = []
    for layer in net.layers:
        if isinstance(layer, keras.Model):
            found.extend(keras_layers(layer))
        else:
            found.append(layer)
    return found


def _torch_macs(model: models.OptimizableModel, sample: tuple[np.ndarray, ...]) -> int:
    import torch

    module = model.model
    if model.kind == Framework.EXPORTED_PROGRAM or isinstance(module, torch.jit.ScriptModule):
        return _torch_macs_from_weights(module, sample)
    total = 0

    def hook(layer: nn.Module, _inputs: object, output: Tensor) -> None:
        nonlocal total
        if isinstance(layer, torch.nn.Linear):
            total += int(output.numel() // layer.out_features) * layer.in_features * layer.out_features
        elif isinstance(layer, torch.nn.Conv2d):
            positions = int(output.shape[-1] * output.shape[-2])
            total += positions * int(layer.weight.numel())

    handles = [m.register_forward_hook(hook) for m in module.modules()
               if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    try:
        with torch.no_grad():
            module(*[torch.from_numpy(np.ascontiguousarray(a)) for a in sample])
    finally:
        for handle in handles:
            handle.remove()
    return int(total)


def _torch_macs_from_weights(module: nn.Module, sample: tuple[np.ndarray, ...]) -> int:
    """TorchScript/ExportedProgram modules cannot take hooks: an estimate from the weights that assumes every
    conv keeps the input's spatial size (exact for dense layers, an upper bound for strided/pooled convs)."""
    total = 0
    for name, param in module.named_parameters():
        if not name.endswith("weight"):
            continue
        if param.dim() == 2:
            total += int(param.numel())
        elif param.dim() == 4:
            # Unknown output size without hooks: count one position per spatial element of the input.
            spatial = int(np.prod(sample[0].shape[2:])) if sample[0].ndim == 4 else 1
            total += int(param.numel()) * spatial
    return int(total)
