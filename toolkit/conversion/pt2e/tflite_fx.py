"""The FX nodes a TFLite op of the PyTorch -> TFLite route came from, so that ``runtime_retry`` can keep in float
the op a runtime failed on (LiteRT names TFLite ops: ``LOG version 2``, ``Node number 5 (RESHAPE)``; PT2E
exclusions name FX nodes: ``flatten``, ``linear_1``).

Ops are matched by family (``CONV_2D`` and ``DEPTHWISE_CONV_2D`` are both ``conv2d``) and then by order: where the
artifact holds as many ops of the family as the FX graph holds nodes, the k-th op is the k-th node (litert-torch
lowers the graph in order). Where the counts differ (litert-torch adds layout RESHAPEs and TRANSPOSEs of its
own) every node of the family is named, as the TensorFlow route keeps every op of the failing type float.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# TFLite op -> its family's FX op names (``pt2e.op_name``: the aten overload packet's name)
FAMILIES: Mapping[str, tuple[str, ...]] = {
    **dict.fromkeys(("CONV_2D", "DEPTHWISE_CONV_2D"), ("conv2d", "conv1d", "convolution")),
    "TRANSPOSE_CONV": ("conv_transpose2d", "conv_transpose1d"),
    "FULLY_CONNECTED": ("linear", "addmm"),
    "BATCH_MATMUL": ("matmul", "bmm"),
    "RESHAPE": ("view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze"),
    "TRANSPOSE": ("permute", "transpose"),
    "MAX_POOL_2D": ("max_pool2d",),
    **dict.fromkeys(("AVERAGE_POOL_2D", "MEAN"), ("avg_pool2d", "adaptive_avg_pool2d", "mean")),
    "ADD": ("add",), "SUB": ("sub",), "MUL": ("mul",), "DIV": ("div",), "CONCATENATION": ("cat",),
    "LOGISTIC": ("sigmoid",), "SOFTMAX": ("softmax", "_softmax"), "TANH": ("tanh",), "HARD_SWISH": ("hardswish",),
    "LOG": ("log", "log1p", "softplus"), "EXP": ("exp", "softplus"),
    "RELU": ("relu",), "RELU6": ("relu6", "hardtanh"),
}


def fx_nodes(artifact_ops: Sequence[str], graph: Sequence[tuple[str, str]],
             failing: Sequence[tuple[str, int | None]]) -> tuple[str, ...]:
    """The FX node names (``graph``: (name, op name) in order) of each failing TFLite op ((op, node index or
    None), ``artifact_ops``: the artifact's main graph, in order); () for an op with no family here."""
    names: list[str] = []
    for op, index in failing:
        family = FAMILIES.get(op, ())
        nodes = [name for name, kind in graph if kind in family]
        ranked = [i for i, kind in enumerate(artifact_ops) if kind in FAMILIES and FAMILIES[kind] == family]
        if index is not None and index in ranked and len(ranked) == len(nodes):
            names.append(nodes[ranked.index(index)])
        else:
            names.extend(nodes)
    return tuple(dict.fromkeys(names))
