"""The one fine-tune loop every technique shares, for Keras 3 and PyTorch.

Gradient accumulation, mixed precision (``bf16`` autocast on the CPU, Keras through a ``mixed_bfloat16``
clone; ``fp16`` with loss scaling needs a CUDA GPU), activation checkpointing (toolkit.optimization.memory),
optimizer offloading (toolkit.optimization.offload) and distillation's soft targets. After every optimizer
update it calls ``after_update(index)``: where pruning keeps its mask and clustering its centroids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any  # Any: Keras objects (untyped, imported lazily)

import numpy as np

from toolkit.errors import UsageError
from toolkit.model.vocabulary import Framework
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.memory import KERAS_REMAT_MODE
from toolkit.optimization.offload import Offload, OffloadedOptimizer

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor
    from torch.amp import GradScaler
    from torch.optim import Optimizer


class MixedPrecision(StrEnum):
    """The precision fine-tuning computes in (weights stay fp32): fp32, or bf16/fp16 autocast."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"  # needs a CUDA GPU: dynamic loss scaling (loss_scaler)


AfterUpdate = Callable[[int], None]


@dataclass(frozen=True)
class FineTuneConfig:
    """How to fine-tune. ``epochs`` passes over the training data; ``accumulate`` micro-batches of
    ``batch_size`` per optimizer update."""

    epochs: int = 2
    batch_size: int = 32
    learning_rate: float = 1e-3
    accumulate: int = 1
    precision: MixedPrecision = MixedPrecision.FP32
    seed: int = 0
    # Recompute each block's activations in backward instead of keeping them (PyTorch; toolkit.optimization.memory)
    checkpoint_activations: bool = False
    # Where Adam's moments live (PyTorch; toolkit.optimization.offload): None with the model, cpu, disk
    offload_optimizer: Offload | None = None

    def __post_init__(self) -> None:
        if self.epochs < 0:
            raise UsageError(f"epochs must be >= 0, got {self.epochs}.")
        if self.batch_size < 1:
            raise UsageError(f"batch size must be >= 1, got {self.batch_size}.")
        if self.accumulate < 1:
            raise UsageError(f"gradient accumulation must be >= 1 micro-batch, got {self.accumulate}.")
        if not self.learning_rate > 0:
            raise UsageError(f"learning rate must be > 0, got {self.learning_rate}.")

    def updates(self, samples: int) -> int:
        """Optimizer updates the loop will make over ``samples`` training samples."""
        batches = -(-samples // self.batch_size)
        return self.epochs * (-(-batches // self.accumulate))


@dataclass(frozen=True)
class Distillation:
    """Teacher logits for every training sample, the temperature, and the weight of the hard-label loss."""

    teacher_logits: np.ndarray
    temperature: float = 4.0
    alpha: float = 0.3


def outputs_are_probabilities(outputs: np.ndarray) -> bool:
    """True when a model ends in softmax (rows non-negative, summing to 1): its logits are then log(p)."""
    rows = outputs.reshape(len(outputs), -1)
    return bool(np.all(rows >= -1e-6) and np.allclose(rows.sum(-1), 1.0, atol=1e-3))


def fine_tune(model: models.OptimizableModel, data: LabelledData, *, config: FineTuneConfig,
              after_update: AfterUpdate | None = None, distill: Distillation | None = None) -> float:
    """Train ``model`` in place on ``data``; returns the mean loss of the last epoch."""
    if data.labels is None:
        raise UsageError(f"The training data {str(data.path)!r} has no labels under 'y'.",
                         hint="Fine-tuning needs integer class labels stored under 'y'.")
    probe = models.predict(model, data.first(min(len(data), 16)))
    probabilities = outputs_are_probabilities(probe)
    if config.precision == MixedPrecision.FP16 and not _gpu_available(model):
        raise UsageError("fp16 mixed precision with loss scaling needs a CUDA GPU, and none is available here.",
                         hint="Use --mixed-precision bf16 on a CPU.")
    if model.kind == Framework.KERAS:
        if config.offload_optimizer is not None:
            raise UsageError("Optimizer-state offloading is offered for PyTorch models; this one is Keras.",
                             hint="Fine-tune without --offload-optimizer.")
        return _fine_tune_keras(model, data, config, after_update, distill, probabilities)
    if config.checkpoint_activations:
        from toolkit.optimization.memory import activation_checkpointing

        with activation_checkpointing(model.model):
            return _fine_tune_torch(model, data, config, after_update, distill, probabilities)
    return _fine_tune_torch(model, data, config, after_update, distill, probabilities)


def _gpu_available(model: models.OptimizableModel) -> bool:
    if model.kind == Framework.KERAS:
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    import torch

    return bool(torch.cuda.is_available())


# --- Keras 3 -------------------------------------------------------------------------------------------------


def _with_policy(net: Any, policy: str | None, *, remat: bool = False) -> Any:
    """A clone of ``net`` whose layers compute under ``policy`` (weights stay float32), weights copied.

    Training always runs on a clone, so the model that is saved carries no optimizer state. With ``remat`` the
    clone's layers are built inside ``keras.RematScope(mode="activations")``: each layer's activation function
    is recomputed in backward instead of its intermediates being kept (toolkit.optimization.memory says why
    not ``mode="full"``).
    """
    import contextlib

    import keras

    def clone(layer: Any) -> Any:
        config = layer.get_config()
        if policy is not None:
            config["dtype"] = policy
        return layer.__class__.from_config(config)

    with keras.RematScope(mode=KERAS_REMAT_MODE) if remat else contextlib.nullcontext():
        clone_net = keras.models.clone_model(net, clone_function=clone)
    clone_net.set_weights(net.get_weights())
    return clone_net


def _fine_tune_keras(model: models.OptimizableModel, data: LabelledData, config: FineTuneConfig,
                     after_update: AfterUpdate | None, distill: Distillation | None, probabilities: bool) -> float:
    import keras
    from keras import ops

    net = model.model
    if len(net.outputs) != 1:
        raise UsageError("Fine-tuning supports models with one output (the class scores); this one has "
                         f"{len(net.outputs)}.")
    keras.utils.set_random_seed(config.seed)
    policy = {MixedPrecision.BF16: "mixed_bfloat16", MixedPrecision.FP16: "mixed_float16"}.get(config.precision)
    train_net = _with_policy(net, policy, remat=config.checkpoint_activations)
    temperature = distill.temperature if distill else 1.0
    alpha = distill.alpha if distill else 1.0

    def loss(y_true: Any, y_pred: Any) -> Any:
        y_pred = ops.cast(y_pred, "float32")
        logits = ops.log(ops.clip(y_pred, 1e-7, 1.0)) if probabilities else y_pred
        labels = ops.cast(y_true[:, 0], "int32")
        value = alpha * keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        if distill is not None:
            teacher = y_true[:, 1:] / temperature
            student = logits / temperature
            kl = ops.sum(ops.softmax(teacher) * (ops.log_softmax(teacher) - ops.log_softmax(student)), axis=-1)
            value = value + (1.0 - alpha) * temperature * temperature * kl
        return value

    assert data.labels is not None
    targets = data.labels.astype(np.float32)[:, None]
    if distill is not None:
        targets = np.concatenate([targets, distill.teacher_logits.astype(np.float32)], axis=1)
    optimizer = keras.optimizers.Adam(
        config.learning_rate,
        gradient_accumulation_steps=config.accumulate if config.accumulate > 1 else None,
    )
    train_net.compile(optimizer=optimizer, loss=loss)

    class _Hook(keras.callbacks.Callback):  # type: ignore[misc, unused-ignore]  # keras is untyped: its classes are Any
        def __init__(self) -> None:
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.batches += 1
            if after_update is not None and self.batches % config.accumulate == 0:
                if train_net is not net:
                    net.set_weights(train_net.get_weights())
                after_update(self.batches // config.accumulate)
                if train_net is not net:
                    train_net.set_weights(net.get_weights())

    inputs = list(data.inputs) if len(data.inputs) > 1 else data.inputs[0]
    history = train_net.fit(inputs, targets, epochs=config.epochs, batch_size=config.batch_size, shuffle=True,
                            verbose=0, callbacks=[_Hook()])
    if train_net is not net:
        net.set_weights(train_net.get_weights())
    losses = history.history.get("loss", [float("nan")])
    return float(losses[-1])


# --- PyTorch -------------------------------------------------------------------------------------------------


def loss_scaler(precision: MixedPrecision, device: str) -> GradScaler | None:
    """fp16 trains with dynamic loss scaling (``torch.amp.GradScaler``): the loss is multiplied before backward
    so small fp16 gradients do not flush to zero; a step whose gradients overflow is skipped and the scale
    halved, and after a run of good steps the scale grows. None for fp32/bf16, which need no scaling."""
    if precision != MixedPrecision.FP16:
        return None
    import torch

    return torch.amp.GradScaler(device)


def backward(loss: Tensor, scaler: GradScaler | None) -> None:
    """Back-propagate ``loss``, scaled when training in fp16."""
    (scaler.scale(loss) if scaler is not None else loss).backward()


def update(optimizer: Optimizer, scaler: GradScaler | None) -> None:
    """One optimizer update; with a scaler, the gradients are unscaled first and an overflowing step is skipped."""
    if scaler is None:
        optimizer.step()
        return
    scaler.step(optimizer)
    scaler.update()


def _fine_tune_torch(model: models.OptimizableModel, data: LabelledData, config: FineTuneConfig,
                     after_update: AfterUpdate | None, distill: Distillation | None, probabilities: bool) -> float:
    import torch
    import torch.nn.functional as F

    module = model.model
    torch.manual_seed(config.seed)
    device = "cuda" if config.precision == MixedPrecision.FP16 else "cpu"
    module.to(device)
    if model.kind != Framework.EXPORTED_PROGRAM:
        module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    from toolkit.optimization.offloaded_adam import make_adam

    optimizer = make_adam(params, learning_rate=config.learning_rate, offload=config.offload_optimizer,
                          device=device)
    scaler = loss_scaler(config.precision, device)
    autocast_dtype = {MixedPrecision.BF16: torch.bfloat16, MixedPrecision.FP16: torch.float16}.get(config.precision)
    temperature = distill.temperature if distill else 1.0
    alpha = distill.alpha if distill else 1.0
    inputs = [torch.from_numpy(np.ascontiguousarray(a)) for a in data.inputs]
    labels = torch.from_numpy(data.labels if data.labels is not None else np.zeros(len(data), np.int64))
    teacher = torch.from_numpy(distill.teacher_logits.astype(np.float32)) if distill else None
    fixed_batch = (model.example[0].shape[0] if model.kind == Framework.EXPORTED_PROGRAM and model.example
                   and not model.dynamic_batch else None)
    batch_size = fixed_batch or config.batch_size
    generator = torch.Generator().manual_seed(config.seed)
    updates = 0
    epoch_loss = float("nan")
    for _epoch in range(config.epochs):
        order = torch.randperm(len(data), generator=generator)
        batches = [order[i:i + batch_size] for i in range(0, len(data), batch_size)]
        if fixed_batch:
            batches = [b for b in batches if len(b) == fixed_batch]
        total, seen = 0.0, 0
        optimizer.zero_grad(set_to_none=True)
        for index, batch in enumerate(batches):
            xs = [x[batch].to(device) for x in inputs]
            ys = labels[batch].to(device)
            with torch.autocast(device_type=device, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                out = module(*xs)
            out = (out[0] if isinstance(out, (list, tuple)) else out).float()
            logits = torch.log(out.clamp_min(1e-7)) if probabilities else out
            loss = alpha * F.cross_entropy(logits, ys)
            if teacher is not None:
                soft = teacher[batch].to(device) / temperature
                kl = F.kl_div(F.log_softmax(logits / temperature, -1), F.log_softmax(soft, -1),
                              log_target=True, reduction="batchmean")
                loss = loss + (1.0 - alpha) * temperature * temperature * kl
            total += float(loss.detach()) * len(batch)
            seen += len(batch)
            backward(loss / config.accumulate, scaler)
            if (index + 1) % config.accumulate == 0 or index + 1 == len(batches):
                update(optimizer, scaler)
                optimizer.zero_grad(set_to_none=True)
                updates += 1
                if after_update is not None:
                    with torch.no_grad():
                        after_update(updates)
        epoch_loss = total / max(seen, 1)
    if isinstance(optimizer, OffloadedOptimizer):
        optimizer.close()  # the state file goes now, not when the collector finds it
    module.to("cpu")
    if model.kind != Framework.EXPORTED_PROGRAM:
        module.eval()
    return epoch_loss
