"""PyTorch's private members that edgetk relies on (pinned: torch==2.13.0, pyproject.toml).

- ``torch.utils._pytree.tree_map`` (``conversion/torch_pte``: a half-precision copy's inputs and outputs cast
  leaf by leaf, whatever their nesting); torch has no public name for it.

PyTorch is imported on first use, never by importing this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from toolkit.compat import Member

T = TypeVar("T")

PIN = "torch==2.13.0"

MEMBERS = (Member("torch.utils._pytree", "tree_map"),)


def tree_map(fn: Callable[[object], object], tree: T) -> T:
    """``tree`` (tensors nested in tuples, lists and dicts) with ``fn`` applied to every leaf: the same nesting."""
    from torch.utils import _pytree

    mapped: T = _pytree.tree_map(fn, tree)
    return mapped
