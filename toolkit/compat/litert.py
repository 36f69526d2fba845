"""LiteRT's private members that edgetk relies on (pinned: ai-edge-litert==2.3.0, pyproject.toml).

- The interpreter's op list with each op's output tensors (``conversion/tflite/artifact``: the layers in graph
  order); the public API lists tensors only.
- On the device, the runner's TFLite block (``device_side/src/runner/tflite.py``, which cannot import toolkit/)
  reads a tensor's name through the interpreter's wrapper: listed here so the same test names the pin.
"""

from __future__ import annotations

from typing import Any

from toolkit.compat import Member

PIN = "ai-edge-litert==2.3.0"

MEMBERS = (
    Member("ai_edge_litert.interpreter:Interpreter", "_get_ops_details"),
    Member("ai_edge_litert.interpreter:Interpreter", "_interpreter", instance=True),  # the runner: TensorName
)


def ops_details(interpreter: Any) -> list[dict[str, Any]]:  # Any: LiteRT's Interpreter and its op records
    """Each op of the interpreter's model, in graph order: its index, name, inputs and outputs (tensor indices)."""
    return list(interpreter._get_ops_details())
