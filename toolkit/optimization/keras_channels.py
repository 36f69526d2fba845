"""Structured (channel) pruning of Keras 3 Functional and Sequential models, residual blocks included.

A *channel group* is a conv (``groups=1``) or dense producer and every layer its output reaches through
channel-wise layers (BatchNormalization, activations, depthwise convs, padding, pooling, dropout, flatten)
until convs or dense layers consume it; removing a channel removes the producer's filter, the per-channel
weights in between and the consumers' input rows, so the model computes the same function minus that channel.
A group whose channels reach anything else (a residual ``Add`` or ``Concatenate``, a model output, a shared
layer, a reshape, softmax, an unknown layer) is left whole (docs/optimization.md: the inverted residual).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any  # Any: Keras layers and nodes (Keras is untyped); dict[str, Any]: JSON-ready details

import numpy as np

from toolkit.compat import keras as keras_compat
from toolkit.errors import UsageError

# Layers without weights that act on each channel alone (the channel axis is last and survives them).
_WEIGHTLESS = ("ReLU", "Activation", "LeakyReLU", "ELU", "Dropout", "SpatialDropout1D", "SpatialDropout2D",
               "SpatialDropout3D", "GaussianNoise", "GaussianDropout", "AlphaDropout", "MaxPooling1D",
               "MaxPooling2D", "AveragePooling1D", "AveragePooling2D", "GlobalAveragePooling1D",
               "GlobalAveragePooling2D", "GlobalMaxPooling1D", "GlobalMaxPooling2D", "ZeroPadding1D",
               "ZeroPadding2D", "Cropping1D", "Cropping2D", "UpSampling1D", "UpSampling2D", "Identity")
# Activations that mix channels: a group whose channels pass one of them is left whole.
_MIXING_ACTIVATIONS = ("softmax", "log_softmax")


@dataclass
class ChannelGroup:
    """One producer's output channels and the layers that must be resized with them.

    ``between`` and ``consumers`` hold (layer name, positions): positions > 1 after a Flatten, where each
    channel appears once per spatial position (channels-last order).
    """

    producer: str
    channels: int
    between: list[tuple[str, int]] = field(default_factory=list)
    consumers: list[tuple[str, int]] = field(default_factory=list)


def _channels_last(layer: Any) -> bool:
    return getattr(layer, "data_format", "channels_last") == "channels_last"


def _is_producer(layer: Any) -> bool:
    import keras

    if type(layer) is keras.layers.Dense:
        return True
    return type(layer) is keras.layers.Conv2D and layer.groups == 1 and _channels_last(layer)


def _mixes_channels(layer: Any) -> bool:
    activation = getattr(layer, "activation", None)
    return getattr(activation, "__name__", "") in _MIXING_ACTIVATIONS


def _per_channel_kind(layer: Any, rank: int) -> str | None:
    """'weightless', 'batchnorm', 'depthwise' or 'prelu' for a layer channels pass through; None otherwise."""
    name = type(layer).__name__
    if name in _WEIGHTLESS:
        if name == "Activation" and _mixes_channels(layer):
            return None
        return "weightless" if _channels_last(layer) else None
    if name == "BatchNormalization":
        axis = layer.axis if isinstance(layer.axis, int) else None
        return "batchnorm" if axis in (-1, rank - 1) else None
    if name == "DepthwiseConv2D":
        return "depthwise" if layer.depth_multiplier == 1 and _channels_last(layer) else None
    if name == "PReLU":
        return "prelu"
    return None


class _Graph:
    """A Functional model's layers, each with its one call (node), and who consumes each layer's output."""

    def __init__(self, functional: Any) -> None:
        import keras

        self.functional = functional
        self.node_of: dict[str, Any] = {}
        self.shared: set[str] = set()
        self.consumers: dict[str, list[str]] = {}
        for nodes in keras_compat.nodes_by_depth(functional).values():
            for node in nodes:
                op = node.operation
                if isinstance(op, keras.layers.InputLayer):
                    continue
                if op.name in self.node_of:
                    self.shared.add(op.name)
                self.node_of[op.name] = node
        self.layers = {name: node.operation for name, node in self.node_of.items()}
        for name, node in self.node_of.items():
            for tensor in node.input_tensors:
                source = keras_compat.producing_layer_name(tensor)
                self.consumers.setdefault(source, []).append(name)
        self.outputs = {keras_compat.producing_layer_name(t) for t in functional.outputs}

    def single_input_shape(self, name: str) -> tuple[Any, ...] | None:
        node = self.node_of[name]
        if len(node.input_tensors) != 1:
            return None
        return tuple(node.input_tensors[0].shape)


def channel_groups(functional: Any) -> tuple[list[ChannelGroup], dict[str, str]]:
    """The prunable groups of ``functional``, and for each producer left whole, why (for the report)."""
    graph = _Graph(functional)
    groups: list[ChannelGroup] = []
    skipped: dict[str, str] = {}
    for layer in functional.layers:  # in the model's (topological) layer order, so the report reads top-down
        name = layer.name
        if name not in graph.layers or not _is_producer(layer):
            continue
        group, reason = _trace(graph, name)
        if group is None:
            skipped[name] = reason
        else:
            groups.append(group)
    return groups, skipped


def _trace(graph: _Graph, producer: str) -> tuple[ChannelGroup | None, str]:
    layer = graph.layers[producer]
    if producer in graph.shared:
        return None, "called more than once"
    if producer in graph.outputs:
        return None, "its channels reach a model output"
    if _mixes_channels(layer):
        return None, "softmax over its channels"
    channels = int(layer.kernel.shape[-1])
    group = ChannelGroup(producer=producer, channels=channels)
    stack = [(producer, 1)]
    seen: set[str] = set()
    while stack:
        current, positions = stack.pop()
        if current in graph.outputs:
            return None, "its channels reach a model output"
        for user in graph.consumers.get(current, []):
            if user in seen:
                continue
            seen.add(user)
            target = graph.layers[user]
            shape = graph.single_input_shape(user)
            if user in graph.shared:
                return None, f"{user!r} is called more than once"
            if shape is None:
                return None, f"its channels reach {type(target).__name__} {user!r} (a merge of branches)"
            if _is_producer(target):
                group.consumers.append((user, positions))
                continue
            if type(target).__name__ == "Flatten":
                spatial = shape[1:-1]
                if positions != 1 or any(d is None for d in spatial):
                    return None, f"Flatten {user!r} of an unknown shape"
                stack.append((user, int(math.prod(spatial))))
                continue
            kind = _per_channel_kind(target, len(shape))
            if kind is None:
                return None, f"its channels reach {type(target).__name__} {user!r}"
            if kind != "weightless":
                group.between.append((user, positions))
            stack.append((user, positions))
    if not group.consumers:
        return None, "no conv or dense layer consumes its channels"
    return group, ""


def _expand(keep: np.ndarray, channels: int, positions: int) -> np.ndarray:
    """Indices kept in a flattened (positions x channels, channels last) feature vector."""
    if positions == 1:
        return keep
    expanded: np.ndarray = (np.arange(positions)[:, None] * channels + keep[None, :]).reshape(-1)
    return expanded


def prune_keras_channels(net: Any, sparsity: float, sample: np.ndarray) -> tuple[Any, dict[str, Any]]:
    """A rebuilt (plain Functional) model with ``sparsity`` of each prunable group's channels removed, and the
    report details: channels per producer [before, after], and the producers left whole with the reason."""
    import keras

    from toolkit.optimization.keras_graph import as_functional
    from toolkit.optimization.pruning import keep_channels

    functional = as_functional(net)
    if len(functional.inputs) != 1 or len(functional.outputs) != 1:
        raise UsageError("Structured pruning needs a Keras model with one input and one output.")
    groups, skipped = channel_groups(functional)
    if not groups:
        raise UsageError(
            "Structured pruning found no channels it can remove: every conv/dense layer's output feeds a "
            "residual add, a concatenation, the model output or a layer it cannot resize.",
            hint="Use unstructured pruning (--prune without --structured) for this model.",
        )
    graph_layers = {layer.name: layer for layer in functional.layers}
    # Per layer: the slices to apply. out: producer filters; inp: consumer input rows; chan: per-channel weights.
    out_keep: dict[str, np.ndarray] = {}
    in_keep: dict[str, np.ndarray] = {}
    chan_keep: dict[str, tuple[np.ndarray, int]] = {}
    shapes: dict[str, list[int]] = {}
    for group in groups:
        kernel = np.asarray(graph_layers[group.producer].kernel)
        keep = keep_channels(np.abs(kernel).reshape(-1, kernel.shape[-1]).sum(0), sparsity)
        out_keep[group.producer] = keep
        shapes[group.producer] = [group.channels, int(keep.size)]
        for name, positions in group.between:
            chan_keep[name] = (_expand(keep, group.channels, positions), group.channels * positions)
        for name, positions in group.consumers:
            in_keep[name] = _expand(keep, group.channels, positions)

    new_layers: dict[str, Any] = {}
    new_weights: dict[str, list[np.ndarray]] = {}
    for name in set(out_keep) | set(in_keep) | set(chan_keep):
        layer = graph_layers[name]
        config = layer.get_config()
        weights = [np.asarray(w) for w in layer.get_weights()]
        if name in out_keep or name in in_keep:  # Conv2D / Dense: [kernel, (bias)]
            kernel, rest = weights[0], weights[1:]
            if name in in_keep:
                kernel = np.take(kernel, in_keep[name], axis=-2)
            if name in out_keep:
                kernel = np.take(kernel, out_keep[name], axis=-1)
                rest = [w[out_keep[name]] for w in rest]
                config["filters" if "filters" in config else "units"] = int(out_keep[name].size)
            weights = [kernel, *rest]
        else:
            index, size = chan_keep[name]
            if type(layer).__name__ == "DepthwiseConv2D":  # [kernel (kh, kw, C, 1), (bias)]
                weights = [np.take(weights[0], index, axis=-2)] + [w[index] for w in weights[1:]]
            else:  # BatchNormalization (gamma, beta, mean, var) or PReLU alpha: per channel on the last axis
                weights = [np.take(w, index, axis=-1) if w.shape[-1] == size else w for w in weights]
        new_layers[name] = layer.__class__.from_config(config)
        new_weights[name] = weights

    rebuilt = keras.models.clone_model(functional, clone_function=lambda layer: new_layers.get(layer.name, layer))
    for name, weights in new_weights.items():
        rebuilt.get_layer(name).set_weights(weights)
    before = np.asarray(functional(sample, training=False))
    after = np.asarray(rebuilt(sample, training=False))
    if before.shape != after.shape:  # a group traced wrongly would change the output: never hand that back
        raise UsageError(f"Structured pruning changed the output shape from {before.shape} to {after.shape}.",
                         hint="Prune without --structured for this model.")
    return rebuilt, {"channels": shapes, "left_whole": skipped}
