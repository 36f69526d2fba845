"""What ``optimize`` was asked to do: the techniques and how to fine-tune, in one record that refuses to be built
wrong (every check runs before any framework loads)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from toolkit.errors import UsageError
from toolkit.optimization.training import FineTuneConfig, MixedPrecision

DEFAULT_EPOCHS = 2
_NEEDS_DATA = "Pass --train-data FILE.npz with the inputs and integer labels under 'y'."

PathText = str | os.PathLike[str]


@dataclass(frozen=True, kw_only=True)
class OptimizeOptions:
    """``prune`` is the target sparsity in (0, 1) (with ``structured``, the fraction of channels removed);
    ``cluster`` the number of shared values per kernel (>= 2); ``low_rank`` the singular-value energy to keep
    in (0, 1] (or ``rank``, a fixed rank); ``distill_from`` a teacher model (the source is the student);
    ``qat`` fine-tunes with fake quantization (PyTorch). With ``train_data`` every step is fine-tuned for
    ``epochs`` (default 2); distillation and QAT need it. ``eval_data`` with labels ``y`` adds accuracy.
    ``checkpoint_activations`` (PyTorch) recomputes activations in backward to lower peak memory;
    ``offload_optimizer`` (PyTorch; ``"cpu"`` off a GPU, ``"disk"`` on a CPU host) keeps Adam's state elsewhere.
    """

    prune: float | None = None
    structured: bool = False
    prune_scope: str = "global"
    cluster: int | None = None
    low_rank: float | None = None
    rank: int | None = None
    distill_from: PathText | None = None
    temperature: float = 4.0
    alpha: float = 0.3
    qat: bool = False
    train_data: PathText | None = None
    eval_data: PathText | None = None
    epochs: int | None = None
    batch_size: int = 32
    learning_rate: float = 1e-3
    accumulate: int = 1
    precision: str = "fp32"
    checkpoint_activations: bool = False
    offload_optimizer: str | None = None

    def __post_init__(self) -> None:
        from toolkit.optimization.clustering import check_clusters
        from toolkit.optimization.low_rank import check_low_rank
        from toolkit.optimization.pruning import SCOPES, check_sparsity

        if not self.techniques_requested:
            raise UsageError("Nothing to do: no technique was requested.",
                             hint="Pass at least one of --prune, --cluster, --low-rank, --distill-from, --qat.")
        if self.prune is not None:
            check_sparsity(self.prune)
        if self.structured and self.prune is None:
            raise UsageError("--structured needs --prune FRACTION (the fraction of channels to remove).")
        if self.prune_scope not in SCOPES:
            raise UsageError(f"Unknown pruning scope {self.prune_scope!r}.", hint="Pick 'global' or 'layer'.")
        if self.cluster is not None:
            check_clusters(self.cluster)
        if self.factorizes:
            check_low_rank(self.low_rank, self.rank)
        self._check_training_data()

    def _check_training_data(self) -> None:
        if (self.distill_from is not None or self.qat) and self.train_data is None:
            technique = "Distillation" if self.distill_from is not None else "Quantization-aware training"
            raise UsageError(f"{technique} trains the model, so it needs training data.", hint=_NEEDS_DATA)
        if self.epochs is not None and self.epochs > 0 and self.train_data is None:
            raise UsageError(f"--epochs {self.epochs} asks for fine-tuning, which needs training data.",
                             hint=_NEEDS_DATA)

    @property
    def techniques_requested(self) -> bool:
        return (self.prune is not None or self.cluster is not None or self.factorizes
                or self.distill_from is not None or self.qat)

    @property
    def factorizes(self) -> bool:
        return self.low_rank is not None or self.rank is not None

    def fine_tune_config(self) -> FineTuneConfig:
        """How every step fine-tunes (validated by FineTuneConfig itself)."""
        from toolkit.optimization.offload import parse_offload

        return FineTuneConfig(epochs=DEFAULT_EPOCHS if self.epochs is None else self.epochs,
                              batch_size=self.batch_size, learning_rate=self.learning_rate,
                              accumulate=self.accumulate, precision=_mixed_precision(self.precision),
                              checkpoint_activations=self.checkpoint_activations,
                              offload_optimizer=parse_offload(self.offload_optimizer))


def _mixed_precision(text: str) -> MixedPrecision:
    """``--mixed-precision`` (or the ``precision`` keyword) parsed; an unknown one names the choices."""
    try:
        return MixedPrecision(text)
    except ValueError:
        raise UsageError(f"Unknown training precision {text!r}.",
                         hint=f"Pick one of {', '.join(MixedPrecision)}.") from None
