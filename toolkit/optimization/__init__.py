"""Compress a model before converting it: pruning (unstructured and structured), weight clustering, low-rank
factorization, knowledge distillation and quantization-aware training, on Keras 3 and PyTorch models.

``optimize(source, ...)`` opens the model in its own framework, applies the requested techniques in a fixed
order (distill -> low-rank -> structured pruning -> pruning -> clustering -> QAT: the ones that change the
architecture first, the ones that constrain weight values last, so later steps keep what earlier ones did),
measures the model after each, and writes it in the source's format. Heavy frameworks load only inside.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any  # Any: **options: Any: OptimizeOptions checks each keyword

from toolkit.model.vocabulary import Framework
from toolkit.errors import UsageError
from toolkit.optimization.report import ModelFigures, OptimizationReport, StepReport
from toolkit.optimization.request import OptimizeOptions
from toolkit.optimization.training import FineTuneConfig

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from toolkit.optimization.data import LabelledData
    from toolkit.optimization.models import OptimizableModel

__all__ = ["FineTuneConfig", "ModelFigures", "OptimizationReport", "OptimizeOptions", "StepReport", "optimize"]


def optimize(source: str | os.PathLike[str], *, out: str | os.PathLike[str], **options: Any) -> OptimizationReport:
    """Apply the requested techniques to ``source`` and write the result to ``out``.

    ``options`` are :class:`OptimizeOptions`' fields (the techniques and how to fine-tune; keyword values,
    checked there before any framework work)."""
    return run_optimization(str(source), Path(out), OptimizeOptions(**options))


def _listing_options(function: Callable[..., object]) -> None:
    """``optimize``'s signature names OptimizeOptions' fields as its keywords (help(), the CLI's front-door test)."""
    import dataclasses
    import inspect

    head = list(inspect.signature(function).parameters.values())[:2]
    keywords = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
                for f in dataclasses.fields(OptimizeOptions)]
    setattr(function, "__signature__", inspect.Signature([*head, *keywords]))


_listing_options(optimize)


def run_optimization(source: str, out: Path, options: OptimizeOptions) -> OptimizationReport:
    """``optimize`` on one validated options record: load, apply each technique in order, write."""
    from toolkit.sources.detect import detect_framework

    config = options.fine_tune_config()
    if options.distill_from is not None:
        detect_framework(str(options.distill_from))
    work = _open(source, out, options)
    work.steps.extend(_apply(work, options, config))
    _write(work.model, out)
    kind = work.model.kind
    output_format = kind if kind in (Framework.KERAS, Framework.EXPORTED_PROGRAM) else Framework.TORCHSCRIPT
    return OptimizationReport(source=source, framework=work.model.framework, output=str(out),
                              output_format=output_format, baseline=work.baseline, steps=tuple(work.steps))


@dataclass
class _Work:
    """The model being optimized, the data it is tuned and measured on, and its figures so far."""

    model: OptimizableModel
    sample: tuple[np.ndarray, ...]
    train: LabelledData | None
    evaluation: LabelledData | None
    baseline: ModelFigures
    steps: list[StepReport] = field(default_factory=list)

    def measured(self, technique: str, settings: dict[str, object], details: dict[str, object],
                 tuned: bool) -> StepReport:
        from toolkit.optimization.measure import measure

        figures = measure(self.model, sample=self.sample, eval_data=self.evaluation)
        return StepReport(technique=technique, settings=settings, details=details, figures=figures, fine_tuned=tuned)


def _open(source: str, out: Path, options: OptimizeOptions) -> _Work:
    """Load the model and its data, find one input sample, measure the baseline."""
    from toolkit.optimization import models
    from toolkit.optimization.data import load_npz
    from toolkit.optimization.measure import measure

    model = models.load(source)
    models.check_output_path(model, out)
    names = model.input_names
    train = None if options.train_data is None else load_npz(options.train_data, input_names=names,
                                                             purpose="training data", need_labels=True)
    evaluation = None if options.eval_data is None else load_npz(options.eval_data, input_names=names,
                                                                 purpose="eval data")
    data_sample = train.first() if train is not None else (evaluation.first() if evaluation is not None else None)
    sample = models.example_inputs(model, data_sample)
    if model.kind != Framework.EXPORTED_PROGRAM and sample is not None:
        model.example = sample
    if sample is None:
        raise UsageError(f"Cannot tell the input shape of {source!r}.",
                         hint="Pass --train-data or --eval-data so the model can be run on one sample.")
    baseline = measure(model, sample=sample, eval_data=evaluation)
    return _Work(model, sample, train, evaluation, baseline)


def _apply(work: _Work, options: OptimizeOptions, config: FineTuneConfig) -> list[StepReport]:
    """Each requested technique in the fixed order, the model measured after each."""
    model, train, o = work.model, work.train, options
    tuned = train is not None and config.epochs > 0
    steps = []
    if o.distill_from is not None:
        from toolkit.optimization.distillation import distill

        details = distill(model, teacher_source=str(o.distill_from), train_data=train, config=config,
                          temperature=o.temperature, alpha=o.alpha)
        settings: dict[str, object] = {"teacher": str(o.distill_from), "temperature": o.temperature, "alpha": o.alpha}
        steps.append(work.measured("distill", settings, details, True))
    if o.factorizes:
        from toolkit.optimization.low_rank import low_rank as factorize

        details = factorize(model, energy=o.low_rank, rank=o.rank, train_data=train, config=config)
        steps.append(work.measured("low_rank", {"energy": o.low_rank, "rank": o.rank}, details, tuned))
    if o.prune is not None and o.structured:
        from toolkit.optimization.structured import prune_structured

        details = prune_structured(model, sparsity=o.prune, sample=work.sample, train_data=train, config=config)
        steps.append(work.measured("prune_structured", {"fraction": o.prune}, details, tuned))
    elif o.prune is not None:
        from toolkit.optimization.pruning import prune as magnitude_prune

        details = magnitude_prune(model, sparsity=o.prune, scope=o.prune_scope, train_data=train, config=config)
        steps.append(work.measured("prune", {"sparsity": o.prune, "scope": o.prune_scope}, details, tuned))
    if o.cluster is not None:
        from toolkit.optimization.clustering import cluster as share_weights

        details = share_weights(model, clusters=o.cluster, train_data=train, config=config)
        steps.append(work.measured("cluster", {"clusters": o.cluster}, details, tuned))
    if o.qat:
        from toolkit.optimization.qat import qat as quantization_aware

        details = quantization_aware(model, train_data=train, config=config)
        steps.append(work.measured("qat", {}, details, True))
    return steps


def _write(model: OptimizableModel, out: Path) -> None:
    """Save beside ``out`` first, then move it into place (a failed save leaves no half-written model)."""
    from toolkit.optimization import models

    partial = out.with_name(f".{out.name}.partial{out.suffix}")
    try:
        models.save(model, partial)
        partial.replace(out)
    finally:
        if partial.exists():
            partial.unlink()
