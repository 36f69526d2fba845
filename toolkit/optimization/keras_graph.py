"""Rebuild Keras 3 models with some layers replaced (low-rank factors; structured pruning: keras_channels.py).

Every rebuild returns a plain Functional model of built-in layers, so the result saves to ``.keras`` and loads
with ``keras.saving.load_model`` and no custom objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any  # Any: Keras models and tensors (Keras is untyped)


def as_functional(net: Any) -> Any:
    """A Sequential model as the equivalent Functional chain (same layer objects, same input name)."""
    import keras

    if not isinstance(net, keras.Sequential):
        return net
    spec = net.inputs[0]
    inputs = keras.Input(batch_shape=spec.shape, name=str(spec.name).split(":")[0], dtype=spec.dtype)
    x = inputs
    for layer in net.layers:
        x = layer(x)
    return keras.Model(inputs, x, name=net.name)


def replace_calls(net: Any, replacements: dict[str, Callable[[Any], Any]]) -> Any:
    """A Functional model where each layer named in ``replacements`` is replaced by ``replacements[name](x)``.

    The other layers are shared with ``net`` (their weights come along).
    """
    import keras

    functional = as_functional(net)

    def call(layer: Any, *args: Any, **kwargs: Any) -> Any:
        if layer.name in replacements:
            return replacements[layer.name](args[0])
        return layer(*args, **kwargs)

    return keras.models.clone_model(functional, clone_function=lambda layer: layer, call_function=call)
