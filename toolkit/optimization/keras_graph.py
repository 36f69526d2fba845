"""Rebuild Keras 3 models with some layers replaced (low-rank factors) or resized (structured pruning).

Every rebuild returns a plain Functional model of built-in layers, so the result saves to ``.keras`` and loads
with ``keras.saving.load_model`` and no custom objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from toolkit.errors import UsageError


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


def chain_layers(net: Any, sample: np.ndarray) -> list[Any]:
    """The layers of a single-input, single-output model that is one chain, in call order.

    Checked by running the chain and comparing with the model; a branching model (residuals, concatenations)
    raises a UsageError, since removing channels there needs the branches pruned alike.
    """
    import keras

    functional = as_functional(net)
    if len(functional.inputs) != 1 or len(functional.outputs) != 1:
        raise UsageError("Structured pruning needs a model with one input and one output.")
    layers = [layer for layer in functional.layers if not isinstance(layer, keras.layers.InputLayer)]
    x = keras.ops.convert_to_tensor(sample)
    for layer in layers:
        try:
            x = layer(x)
        except Exception as exc:  # a layer that cannot take the previous one's output: not a chain
            raise _not_a_chain() from exc
    expected = functional(sample, training=False)
    if tuple(x.shape) != tuple(expected.shape) or not np.allclose(np.asarray(x), np.asarray(expected), atol=1e-5):
        raise _not_a_chain()
    return layers


def _not_a_chain() -> UsageError:
    return UsageError(
        "Structured pruning supports models whose layers form one chain (each layer feeds only the next); "
        "this model branches.",
        hint="Use unstructured pruning (--prune without --structured) for models with residual or parallel "
        "branches.",
    )
