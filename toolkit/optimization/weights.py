"""Uniform access to the prunable weights of a model: conv and dense kernels (biases, norms excluded).

Keras: every layer's ``kernel`` / ``depthwise_kernel`` / ``pointwise_kernel``. PyTorch: every parameter named
``*weight`` with two or more dimensions (Linear and Conv weights; works on TorchScript and ExportedProgram
modules too, whose module types are not visible).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any  # Any: Keras/PyTorch objects (untyped frameworks, imported lazily)

import numpy as np

from toolkit.model.vocabulary import Framework
from toolkit.optimization import models

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

_KERAS_KERNELS = ("kernel", "depthwise_kernel", "pointwise_kernel")


@dataclass(frozen=True)
class WeightRef:
    """One prunable weight tensor: its name, and how to read and write it as numpy."""

    name: str
    get: Callable[[], np.ndarray]
    set: Callable[[np.ndarray], None]


def prunable_weights(model: models.OptimizableModel) -> list[WeightRef]:
    if model.kind == Framework.KERAS:
        return _keras_refs(model.model)
    return _torch_refs(model.model)


def _keras_refs(net: Any) -> list[WeightRef]:
    from toolkit.optimization.measure import keras_layers

    refs = []
    for layer in keras_layers(net):
        for attribute in _KERAS_KERNELS:
            variable = getattr(layer, attribute, None)
            if variable is None or not hasattr(variable, "assign") or len(variable.shape) < 2:
                continue
            refs.append(WeightRef(name=f"{layer.name}/{attribute}", get=_keras_getter(variable),
                                  set=_keras_setter(variable)))
    return refs


def _torch_refs(module: nn.Module) -> list[WeightRef]:
    import torch

    refs = []
    for name, param in module.named_parameters():
        if not name.endswith("weight") or param.dim() < 2:
            continue

        def setter(value: np.ndarray, p: nn.Parameter = param) -> None:
            with torch.no_grad():
                p.copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))

        refs.append(WeightRef(name=name, get=_torch_getter(param), set=setter))
    return refs


def _keras_getter(variable: Any) -> Callable[[], np.ndarray]:
    return lambda: np.asarray(variable)


def _keras_setter(variable: Any) -> Callable[[np.ndarray], None]:
    def write(value: np.ndarray) -> None:
        variable.assign(value.astype(np.float32))

    return write


def _torch_getter(param: nn.Parameter) -> Callable[[], np.ndarray]:
    return lambda: param.detach().cpu().numpy().copy()
