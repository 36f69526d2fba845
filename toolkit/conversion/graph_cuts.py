"""An artifact's main graph cut after its k-th op, as a file of its own (the graph up to that op, its outputs the
model's), and the bisection over such cuts that ``crash_guard`` uses to name the op a runtime crashes on.

One bisection for every format; a format's backend brings only its cuts (``Backend.cuts``: TFLite cuts the main
subgraph's operator list and its signature's outputs, ``tflite.artifact``; ONNX the graph's node list, which ONNX
keeps in topological order, ``onnx.artifact``). Each cut names its last op as the runtime itself names a failing
one, so that ``runtime_retry`` reads it like the runtime's own message: LiteRT's ``Node number 3 (RESHAPE)``,
onnxruntime's ``Conv node. Name:'conv_1'``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Cuts:
    """The cuts of one artifact: ``count`` ops; ``cut(k)`` the artifact's bytes with only its first k ops;
    ``name(k)`` how the runtime names the k-th op (1-based: the last op of ``cut(k)``)."""

    count: int
    cut: Callable[[int], bytes]
    name: Callable[[int], str]


def first_failing(count: int, fails: Callable[[int], bool]) -> int | None:
    """The smallest k in 1..count whose cut fails (a prefix that fails keeps failing as ops are added), by
    bisection; None when even the whole graph (``count``) does not fail alone."""
    low, high = 1, count
    while low < high:  # the smallest cut that fails: its last op is the failing one
        middle = (low + high) // 2
        if fails(middle):
            high = middle
        else:
            low = middle + 1
    if count < 1 or (low == count and not fails(count)):
        return None
    return low
