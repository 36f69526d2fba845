"""Compress a model before converting it: pruning (unstructured and structured), weight clustering, low-rank
factorization, knowledge distillation and quantization-aware training, on Keras 3 and PyTorch models.

``optimize(source, ...)`` opens the model in its own framework, applies the requested techniques in a fixed
order (distill -> low-rank -> structured pruning -> pruning -> clustering -> QAT: the ones that change the
architecture first, the ones that constrain weight values last, so later steps keep what earlier ones did),
measures the model after each, and writes it in the source's format. Heavy frameworks load only inside.
"""

from __future__ import annotations

import os
from pathlib import Path

from toolkit.errors import UsageError
from toolkit.optimization.report import ModelFigures, OptimizationReport, StepReport
from toolkit.optimization.training import FineTuneConfig

__all__ = ["FineTuneConfig", "ModelFigures", "OptimizationReport", "StepReport", "optimize"]

DEFAULT_EPOCHS = 2


def optimize(
    source: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    prune: float | None = None,
    structured: bool = False,
    prune_scope: str = "global",
    cluster: int | None = None,
    low_rank: float | None = None,
    rank: int | None = None,
    distill_from: str | os.PathLike[str] | None = None,
    temperature: float = 4.0,
    alpha: float = 0.3,
    qat: bool = False,
    train_data: str | os.PathLike[str] | None = None,
    eval_data: str | os.PathLike[str] | None = None,
    epochs: int | None = None,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    accumulate: int = 1,
    precision: str = "fp32",
    checkpoint_activations: bool = False,
    offload_optimizer: str | None = None,
) -> OptimizationReport:
    """Apply the requested techniques to ``source`` and write the result to ``out``.

    ``prune`` is the target sparsity in (0, 1) (with ``structured``, the fraction of channels removed);
    ``cluster`` the number of shared values per kernel (>= 2); ``low_rank`` the singular-value energy to keep
    in (0, 1] (or ``rank``, a fixed rank); ``distill_from`` a teacher model (``source`` is the student);
    ``qat`` fine-tunes with fake quantization (PyTorch). With ``train_data`` every step is fine-tuned for
    ``epochs`` (default 2); distillation and QAT need it. ``eval_data`` with labels ``y`` adds accuracy.
    ``checkpoint_activations`` (PyTorch) recomputes activations in backward to lower peak memory;
    ``offload_optimizer`` (PyTorch; ``"cpu"`` off a GPU, ``"disk"`` on a CPU host) keeps Adam's state elsewhere.
    """
    from toolkit.optimization import models
    from toolkit.optimization.clustering import check_clusters
    from toolkit.optimization.data import load_npz
    from toolkit.optimization.low_rank import check_low_rank
    from toolkit.optimization.measure import measure
    from toolkit.optimization.offload import parse_offload
    from toolkit.optimization.pruning import SCOPES, check_sparsity

    source = str(source)
    out_path = Path(out)
    # Validate every option before any framework work.
    if prune is None and cluster is None and low_rank is None and rank is None and distill_from is None and not qat:
        raise UsageError("Nothing to do: no technique was requested.",
                         hint="Pass at least one of --prune, --cluster, --low-rank, --distill-from, --qat.")
    if prune is not None:
        check_sparsity(prune)
    if structured and prune is None:
        raise UsageError("--structured needs --prune FRACTION (the fraction of channels to remove).")
    if prune_scope not in SCOPES:
        raise UsageError(f"Unknown pruning scope {prune_scope!r}.", hint="Pick 'global' or 'layer'.")
    if cluster is not None:
        check_clusters(cluster)
    if low_rank is not None or rank is not None:
        check_low_rank(low_rank, rank)
    if (distill_from is not None or qat) and train_data is None:
        technique = "Distillation" if distill_from is not None else "Quantization-aware training"
        raise UsageError(f"{technique} trains the model, so it needs training data.",
                         hint="Pass --train-data FILE.npz with the inputs and integer labels under 'y'.")
    if epochs is not None and epochs > 0 and train_data is None:
        raise UsageError(f"--epochs {epochs} asks for fine-tuning, which needs training data.",
                         hint="Pass --train-data FILE.npz with the inputs and integer labels under 'y'.")
    config = FineTuneConfig(epochs=DEFAULT_EPOCHS if epochs is None else epochs, batch_size=batch_size,
                            learning_rate=learning_rate, accumulate=accumulate, precision=precision,
                            checkpoint_activations=checkpoint_activations,
                            offload_optimizer=parse_offload(offload_optimizer))
    if distill_from is not None:
        models.detect_framework(str(distill_from))

    model = models.load(source)
    models.check_output_path(model, out_path)
    train = None if train_data is None else load_npz(train_data, input_names=model.input_names,
                                                     purpose="training data", need_labels=True)
    evaluation = None if eval_data is None else load_npz(eval_data, input_names=model.input_names,
                                                         purpose="eval data")
    data_sample = train.first() if train is not None else (evaluation.first() if evaluation is not None else None)
    sample = models.example_inputs(model, data_sample)
    if model.kind != "exported_program" and sample is not None:
        model.example = sample
    if sample is None:
        raise UsageError(f"Cannot tell the input shape of {source!r}.",
                         hint="Pass --train-data or --eval-data so the model can be run on one sample.")

    baseline = measure(model, sample=sample, eval_data=evaluation)
    steps: list[StepReport] = []
    fine_tuning = train is not None and config.epochs > 0

    def record(technique: str, settings: dict[str, object], details: dict[str, object], tuned: bool) -> None:
        figures = measure(model, sample=sample, eval_data=evaluation)
        steps.append(StepReport(technique=technique, settings=settings, details=details, figures=figures,
                                fine_tuned=tuned))

    if distill_from is not None:
        from toolkit.optimization.distillation import distill

        details = distill(model, teacher_source=str(distill_from), train_data=train, config=config,
                          temperature=temperature, alpha=alpha)
        record("distill", {"teacher": str(distill_from), "temperature": temperature, "alpha": alpha},
               details, True)
    if low_rank is not None or rank is not None:
        from toolkit.optimization.low_rank import low_rank as factorize

        details = factorize(model, energy=low_rank, rank=rank, train_data=train, config=config)
        record("low_rank", {"energy": low_rank, "rank": rank}, details, fine_tuning)
    if prune is not None and structured:
        from toolkit.optimization.structured import prune_structured

        details = prune_structured(model, sparsity=prune, sample=sample, train_data=train, config=config)
        record("prune_structured", {"fraction": prune}, details, fine_tuning)
    elif prune is not None:
        from toolkit.optimization.pruning import prune as magnitude_prune

        details = magnitude_prune(model, sparsity=prune, scope=prune_scope, train_data=train, config=config)
        record("prune", {"sparsity": prune, "scope": prune_scope}, details, fine_tuning)
    if cluster is not None:
        from toolkit.optimization.clustering import cluster as share_weights

        details = share_weights(model, clusters=cluster, train_data=train, config=config)
        record("cluster", {"clusters": cluster}, details, fine_tuning)
    if qat:
        from toolkit.optimization.qat import qat as quantization_aware

        details = quantization_aware(model, train_data=train, config=config)
        record("qat", {}, details, True)

    partial = out_path.with_name(f".{out_path.name}.partial{out_path.suffix}")
    try:
        models.save(model, partial)
        partial.replace(out_path)
    finally:
        if partial.exists():
            partial.unlink()
    output_format = {"keras": "keras", "exported_program": "exported_program"}.get(model.kind, "torchscript")
    return OptimizationReport(source=source, framework=model.framework, output=str(out_path),
                              output_format=output_format, baseline=baseline, steps=tuple(steps))
