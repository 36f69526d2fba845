"""Keras's private members that edgetk relies on (pinned: keras==3.15.1, pyproject.toml).

- The graph of a Functional model: its nodes by depth (``optimization/keras_channels``: who consumes a layer's
  output) and the layer that made a symbolic tensor (its history).
- A model's input structure as it was built (a dict, a list, one tensor: ``sources/tensorflow`` feeds it so),
  on a Sequential model through its inner Functional.

Keras is imported by the callers; this module imports nothing of it.
"""

from __future__ import annotations

from typing import Any

from toolkit.compat import Member

PIN = "keras==3.15.1"

MEMBERS = (
    Member("keras.src.ops.function:Function", "_nodes_by_depth", instance=True),
    Member("keras.src.ops.function:Function", "_inputs_struct", instance=True),
    Member("keras.src.ops.node:Node", "_keras_history", instance=True),
    Member("keras.src.models.sequential:Sequential", "_functional", instance=True),
)


def nodes_by_depth(functional: Any) -> dict[int, list[Any]]:  # Any: Keras's Functional and its Nodes
    """A Functional model's nodes (each one call of a layer), keyed by depth from the outputs."""
    return dict(functional._nodes_by_depth)


def producing_layer_name(tensor: Any) -> str:  # Any: a KerasTensor
    """The name of the layer (operation) whose call made the symbolic ``tensor``."""
    return str(tensor._keras_history.operation.name)


def producing_layer_name_or(tensor: object, default: str) -> str:
    """As :func:`producing_layer_name` (``tensor``: a KerasTensor), or ``default`` for a tensor with no history
    (an input's)."""
    history = getattr(tensor, "_keras_history", None)
    name = getattr(getattr(history, "operation", None), "name", None)
    return str(name or default)


def inputs_structure(model: object) -> Any:  # Any: the structure its inputs were built in (nested, Keras's)
    """The structure ``model``'s inputs were built in (a dict, a list, one tensor), or None when it has none
    (a Sequential model reads its inner Functional's)."""
    structure = getattr(model, "_inputs_struct", None)
    if structure is None and hasattr(model, "_functional"):
        structure = getattr(getattr(model, "_functional"), "_inputs_struct", None)
    return structure
