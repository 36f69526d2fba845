"""Low-rank factorization: a dense kernel W (in x out) becomes A (in x r) @ B (r x out) from a truncated SVD
(A = U_r sqrt(S_r), B = sqrt(S_r) V_r^T), a conv kernel (kh x kw x cin x cout) becomes a kh x kw conv to r
channels followed by a 1x1 conv to cout. The rank r is the smallest that keeps ``energy`` of the squared
singular values, or a fixed ``rank``. A layer is replaced only where it pays: r * (in + out) < in * out. The
classifier (the model's last dense layer) is left alone. Keras 3 models are rebuilt with built-in layers;
PyTorch factory models get their ``nn.Linear``/``nn.Conv2d`` modules replaced by ``nn.Sequential`` pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast  # Any: Keras objects (untyped, lazy); JSON details

import numpy as np

from toolkit.model.vocabulary import Framework
from toolkit.errors import UsageError
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.training import FineTuneConfig, fine_tune

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor, nn


@dataclass(frozen=True)
class _Plan:
    name: str
    rows: int  # in (dense) or kh*kw*cin (conv)
    cols: int  # out
    rank: int
    a: np.ndarray
    b: np.ndarray


def check_low_rank(energy: float | None, rank: int | None) -> None:
    if energy is None and rank is None:
        raise UsageError("Low-rank factorization needs an energy threshold or a rank.",
                         hint="Pass e.g. --low-rank 0.9 (keep 90% of the singular values' energy).")
    if energy is not None and not 0.0 < energy <= 1.0:
        raise UsageError(f"The low-rank energy threshold must lie in (0, 1], got {energy}.",
                         hint="Pass e.g. --low-rank 0.9.")
    if rank is not None and rank < 1:
        raise UsageError(f"The low-rank rank must be >= 1, got {rank}.")


def _factor(name: str, matrix: np.ndarray, energy: float | None, rank: int | None) -> _Plan | None:
    rows, cols = matrix.shape
    u, s, vt = np.linalg.svd(matrix.astype(np.float64), full_matrices=False)
    if rank is None:
        assert energy is not None
        share = np.cumsum(s ** 2) / max(float(np.sum(s ** 2)), 1e-30)
        r = int(np.searchsorted(share, energy - 1e-12) + 1)
    else:
        r = rank
    r = min(r, len(s))
    if r * (rows + cols) >= rows * cols:
        return None
    root = np.sqrt(s[:r])
    return _Plan(name, rows, cols, r, (u[:, :r] * root).astype(np.float32), (root[:, None] * vt[:r]).astype(np.float32))


def low_rank(model: models.OptimizableModel, *, energy: float | None, rank: int | None,
             train_data: LabelledData | None, config: FineTuneConfig) -> dict[str, object]:
    check_low_rank(energy, rank)
    if model.kind == Framework.KERAS:
        plans, kept = _keras(model, energy, rank)
    elif model.is_torch_module_code:
        plans, kept = _torch(model, energy, rank)
    else:
        raise UsageError(
            f"Low-rank factorization replaces layers, which a {model.kind} file cannot take (its code is fixed).",
            hint="Pass the PyTorch model as a factory path/to/file.py:make_model.",
        )
    if train_data is not None and config.epochs > 0:
        fine_tune(model, train_data, config=config)
    return {
        "energy": energy,
        "rank": rank,
        "factorized": {p.name: {"shape": [p.rows, p.cols], "rank": p.rank,
                                "params_before": p.rows * p.cols, "params_after": p.rank * (p.rows + p.cols)}
                       for p in plans},
        "kept": kept,
    }


def _check_rank_fits(rank: int | None, shapes: dict[str, tuple[int, int]]) -> None:
    if rank is None or not shapes:
        return
    largest = max(shapes.items(), key=lambda item: min(item[1]))
    limit = min(largest[1])
    if rank >= limit:
        raise UsageError(
            f"Rank {rank} is larger than the layers it would factor: the largest, {largest[0]} "
            f"({largest[1][0]} x {largest[1][1]}), allows a rank below {limit}.",
            hint=f"Pass a rank below {limit}, or an energy threshold with --low-rank.",
        )


def _keras(model: models.OptimizableModel, energy: float | None, rank: int | None) -> tuple[list[_Plan], dict[str, str]]:
    import keras

    from toolkit.optimization.keras_graph import replace_calls
    from toolkit.optimization.measure import keras_layers

    layers = keras_layers(model.model)
    dense = [l for l in layers if isinstance(l, keras.layers.Dense)]
    candidates = [l for l in layers if (isinstance(l, keras.layers.Dense) and l is not dense[-1])
                  or (type(l) is keras.layers.Conv2D and l.groups == 1)]
    matrices = {l.name: np.asarray(l.kernel).reshape(-1, np.asarray(l.kernel).shape[-1]) for l in candidates}
    _check_rank_fits(rank, {n: m.shape for n, m in matrices.items()})
    plans: list[_Plan] = []
    kept: dict[str, str] = {}
    replacements = {}
    for layer in candidates:
        plan = _factor(layer.name, matrices[layer.name], energy, rank)
        if plan is None:
            kept[layer.name] = "a factorization would not have fewer parameters"
            continue
        plans.append(plan)
        replacements[layer.name] = _keras_pair(layer, plan)
    if replacements:
        model.model = replace_calls(model.model, replacements)
    return plans, kept


def _keras_pair(layer: Any, plan: _Plan) -> Any:
    import keras

    bias = None if not layer.use_bias else np.asarray(layer.bias)
    if isinstance(layer, keras.layers.Dense):
        first = keras.layers.Dense(plan.rank, use_bias=False, name=f"{layer.name}_lr_a")
        second = keras.layers.Dense(plan.cols, activation=layer.activation, use_bias=layer.use_bias,
                                    name=f"{layer.name}_lr_b")
        a_kernel, b_kernel = plan.a, plan.b
    else:
        kh, kw, cin, cout = (int(d) for d in layer.kernel.shape)
        first = keras.layers.Conv2D(plan.rank, (kh, kw), strides=layer.strides, padding=layer.padding,
                                    dilation_rate=layer.dilation_rate, data_format=layer.data_format,
                                    use_bias=False, name=f"{layer.name}_lr_a")
        second = keras.layers.Conv2D(cout, 1, activation=layer.activation, use_bias=layer.use_bias,
                                     data_format=layer.data_format, name=f"{layer.name}_lr_b")
        a_kernel, b_kernel = plan.a.reshape(kh, kw, cin, plan.rank), plan.b.reshape(1, 1, plan.rank, cout)

    def call(x: Any) -> Any:
        y = second(first(x))
        first.kernel.assign(a_kernel)
        second.kernel.assign(b_kernel)
        if bias is not None:
            second.bias.assign(bias)
        return y

    return call


def _torch(model: models.OptimizableModel, energy: float | None, rank: int | None) -> tuple[list[_Plan], dict[str, str]]:
    import torch
    from torch import nn

    module = model.model
    named = dict(module.named_modules())
    linears = [n for n, m in named.items() if isinstance(m, nn.Linear)]
    candidates = [n for n, m in named.items()
                  if (isinstance(m, nn.Linear) and n != linears[-1])
                  or (type(m) is nn.Conv2d and m.groups == 1 and m.padding_mode == "zeros")]
    matrices = {}
    for name in candidates:
        weight = named[name].weight.detach().numpy()
        # torch keeps (out, in[, kh, kw]); factor the (in * kh * kw) x out matrix, channel-major like the weight
        matrices[name] = weight.reshape(weight.shape[0], -1).T
    _check_rank_fits(rank, {n: m.shape for n, m in matrices.items()})
    plans: list[_Plan] = []
    kept: dict[str, str] = {}
    for name in candidates:
        plan = _factor(name, matrices[name], energy, rank)
        if plan is None:
            kept[name] = "a factorization would not have fewer parameters"
            continue
        plans.append(plan)
        layer = named[name]
        if isinstance(layer, nn.Linear):
            first: nn.Linear | nn.Conv2d = nn.Linear(layer.in_features, plan.rank, bias=False)
            second: nn.Linear | nn.Conv2d = nn.Linear(plan.rank, layer.out_features, bias=layer.bias is not None)
            a_weight = plan.a.T
            b_weight = plan.b.T
        else:
            out_c, in_c, kh, kw = layer.weight.shape
            first = nn.Conv2d(in_c, plan.rank, (kh, kw), stride=layer.stride, padding=layer.padding,
                              dilation=layer.dilation, bias=False)
            second = nn.Conv2d(plan.rank, out_c, 1, bias=layer.bias is not None)
            a_weight = plan.a.T.reshape(plan.rank, in_c, kh, kw)
            b_weight = plan.b.T.reshape(out_c, plan.rank, 1, 1)
        with torch.no_grad():
            first.weight.copy_(torch.from_numpy(np.ascontiguousarray(a_weight)))
            second.weight.copy_(torch.from_numpy(np.ascontiguousarray(b_weight)))
            if layer.bias is not None:  # second was made with a bias then
                cast("Tensor", second.bias).copy_(layer.bias)
        set_submodule(module, name, nn.Sequential(first, second))
    return plans, kept


def set_submodule(root: nn.Module, name: str, new: nn.Module) -> None:
    """Replace ``root``'s submodule at the dotted ``name`` with ``new``."""
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)
