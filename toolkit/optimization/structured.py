"""Structured (filter/channel) pruning: remove the ``sparsity`` fraction of output channels with the smallest
L1 norm from conv and dense layers and the matching inputs of the next layers, and rebuild the layers smaller,
so parameters, MACs and latency drop (not only the zipped size). Keras 3: any Functional/Sequential graph
(``keras_channels.py``). PyTorch: factory modules whose traced graph is one chain (branching graphs are refused).
Fine-tunes afterwards when training data is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast  # Any: torch modules read by attribute; JSON details

import numpy as np

from toolkit.model.vocabulary import Framework
from toolkit.errors import UsageError
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.pruning import check_sparsity, keep_channels
from toolkit.optimization.training import FineTuneConfig, fine_tune

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor
    from torch.fx import GraphModule, Node


def prune_structured(model: models.OptimizableModel, *, sparsity: float, sample: tuple[np.ndarray, ...],
                     train_data: LabelledData | None, config: FineTuneConfig) -> dict[str, Any]:
    check_sparsity(sparsity)
    left_whole: dict[str, str] = {}
    if model.kind == Framework.KERAS:
        shapes, left_whole = _keras(model, sparsity, sample[0])
    elif model.is_torch_module_code:
        shapes = _torch(model, sparsity, sample)
    else:
        raise UsageError(
            f"Structured pruning rebuilds layers, which a {model.kind} file cannot take (its code is fixed).",
            hint="Pass the PyTorch model as a factory path/to/file.py:make_model, or prune without --structured.",
        )
    if train_data is not None and config.epochs > 0:
        fine_tune(model, train_data, config=config)
    return {"fraction_removed": sparsity, "channels": shapes, "left_whole": left_whole}


# --- Keras 3 -------------------------------------------------------------------------------------------------


def _keras(model: models.OptimizableModel, sparsity: float, sample: np.ndarray) -> tuple[dict[str, list[int]],
                                                                                        dict[str, str]]:
    from toolkit.optimization.keras_channels import prune_keras_channels

    rebuilt, details = prune_keras_channels(model.model, sparsity, sample[:1])
    model.model = rebuilt
    return details["channels"], details["left_whole"]


# --- PyTorch -------------------------------------------------------------------------------------------------

_TORCH_PASS_FUNCTIONS = {"relu", "relu_", "max_pool2d", "avg_pool2d", "dropout", "adaptive_avg_pool2d",
                         "gelu", "silu", "sigmoid", "tanh", "leaky_relu"}
_TORCH_FLATTEN = {"flatten", "view", "reshape"}


def _torch(model: models.OptimizableModel, sparsity: float, sample: tuple[np.ndarray, ...]) -> dict[str, list[int]]:
    import torch
    from torch import fx, nn
    from torch.fx.passes.shape_prop import ShapeProp

    from toolkit.optimization.low_rank import set_submodule

    module = model.model.eval()
    try:
        graph = fx.symbolic_trace(module)
    except Exception as exc:  # fx raises many types on data-dependent control flow
        raise UsageError(f"Structured pruning could not trace the model's forward ({type(exc).__name__}).",
                         hint="Prune without --structured for this model.") from exc
    ShapeProp(graph).propagate(*[torch.from_numpy(np.ascontiguousarray(a)) for a in sample])
    chain = _torch_chain(graph)
    named = dict(module.named_modules())
    kinds = []
    for node in chain:
        if node.op == "call_module":
            kinds.append(named[node.target])
        else:
            kinds.append(node)
    weighted = [i for i, k in enumerate(kinds)
                if isinstance(k, nn.Linear) or (type(k) is nn.Conv2d and k.groups == 1)]
    if len(weighted) < 2:
        raise UsageError("Structured pruning needs at least two conv or dense layers (the last one, the "
                         "classifier, keeps its outputs).")
    shapes: dict[str, list[int]] = {}
    keep_in: np.ndarray | None = None
    for i, (node, kind) in enumerate(zip(chain, kinds)):
        if i in weighted:
            weight = kind.weight.detach()
            if keep_in is not None:
                weight = weight[:, torch.from_numpy(keep_in)]
            bias = None if kind.bias is None else kind.bias.detach()
            keep_out = None
            if i != weighted[-1]:
                keep_out = keep_channels(weight.abs().reshape(weight.shape[0], -1).sum(1).numpy(), sparsity)
                weight = weight[torch.from_numpy(keep_out)]
                bias = None if bias is None else bias[torch.from_numpy(keep_out)]
            if isinstance(kind, nn.Linear):
                new: nn.Linear | nn.Conv2d = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
            else:
                new = nn.Conv2d(weight.shape[1], weight.shape[0], kind.kernel_size, stride=kind.stride,
                                padding=kind.padding, dilation=kind.dilation, bias=bias is not None,
                                padding_mode=kind.padding_mode)
            with torch.no_grad():
                new.weight.copy_(weight)
                if bias is not None:  # made with bias=True just above
                    cast("Tensor", new.bias).copy_(bias)
            shapes[str(node.target)] = [int(kind.weight.shape[0]), int(weight.shape[0])]
            set_submodule(module, str(node.target), new)
            keep_in = keep_out
        elif isinstance(kind, (nn.BatchNorm2d, nn.BatchNorm1d)):
            if keep_in is not None:
                index = torch.from_numpy(keep_in)
                new_bn: Any = type(kind)(int(keep_in.size), eps=kind.eps, momentum=kind.momentum, affine=kind.affine,
                                    track_running_stats=kind.track_running_stats)
                with torch.no_grad():
                    if kind.affine:
                        new_bn.weight.copy_(kind.weight[index])
                        new_bn.bias.copy_(kind.bias[index])
                    if kind.track_running_stats:
                        stats: Any = kind
                        new_bn.running_mean.copy_(stats.running_mean[index])
                        new_bn.running_var.copy_(stats.running_var[index])
                set_submodule(module, str(node.target), new_bn.eval())
        elif _is_flatten(node, kind):
            if keep_in is not None:
                source_shape = chain[i - 1].meta["tensor_meta"].shape
                positions = int(np.prod(source_shape[2:]))
                keep_in = (keep_in[:, None] * positions + np.arange(positions)[None, :]).reshape(-1)
        elif not _is_passthrough(kind):
            label = type(kind).__name__ if isinstance(kind, nn.Module) else str(node.target)
            raise UsageError(f"Structured pruning does not know how to resize {label!r} ({node.name}).",
                             hint="Prune without --structured for this model.")
    return shapes


def _torch_chain(graph: GraphModule) -> list[Node]:
    """The graph's tensor path from the input to the output; branching graphs raise a UsageError."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise UsageError("Structured pruning needs a model with one input.")
    chain: list[Node] = []
    node = placeholders[0]
    while True:
        users = [u for u in node.users if not (u.op in ("call_method", "call_function")
                                             and getattr(u.target, "__name__", u.target) in ("size", "dim"))]
        if len(users) != 1:
            raise _branching()
        node = users[0]
        if node.op == "output":
            return chain
        tensor_inputs = [a for a in node.all_input_nodes if "tensor_meta" in a.meta
                         and not (a.op in ("call_method", "call_function")
                                  and getattr(a.target, "__name__", a.target) in ("size", "dim"))]
        if len(tensor_inputs) != 1:
            raise _branching()
        chain.append(node)


def _branching() -> UsageError:
    return UsageError(
        "Structured pruning supports models whose layers form one chain; this model's forward branches.",
        hint="Use unstructured pruning (--prune without --structured) for models with residual branches.",
    )


def _is_flatten(node: Node, kind: object) -> bool:
    from torch import nn

    if isinstance(kind, nn.Flatten):
        return True
    name = getattr(node.target, "__name__", node.target)
    return node.op in ("call_function", "call_method") and name in _TORCH_FLATTEN


def _is_passthrough(kind: Any) -> bool:
    from torch import nn

    if isinstance(kind, nn.Module):
        return isinstance(kind, (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh,
                                 nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Dropout, nn.Identity))
    name = getattr(kind.target, "__name__", kind.target)
    return name in _TORCH_PASS_FUNCTIONS
