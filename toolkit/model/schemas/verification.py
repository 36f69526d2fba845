"""The schema of an artifact's ``verification`` and ``golden`` objects in ``manifest.json`` (per output, per
slice), and their readers into :class:`~toolkit.model.artifact.Verification` and
:class:`~toolkit.model.artifact.Golden`."""

from __future__ import annotations


from toolkit.model.artifact import Golden, Verification
from toolkit.model.records import JsonDict, OutputMetrics, SliceCheck, SliceMetrics
from toolkit.model.schemas.fields import Int, Number, Str, Table

Free = JsonDict  # a table whose keys the manifest does not fix (pydantic's raw JSON values)
Real = Number | None  # null: not finite when written (JSON has no NaN), read back as NaN
Run = tuple[Int, Int]


def nan_if_null(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def float_or_none(value: float | None) -> float | None:
    return None if value is None else float(value)


class SliceMetricsM(Table):
    name: Str
    axis: Int
    runs: list[Run]
    float_range: Real = None
    max_abs_error: Real = None
    mean_abs_error: Real = None
    max_error_ratio: Real = None  # derived when written; not read back


class OutputMetricsM(Table):
    name: Str
    index: Int
    max_abs_error: Real = None
    mean_abs_error: Real = None
    cosine_similarity: Real = None
    float_range: Real = None
    max_error_ratio: Real = None  # derived when written; not read back
    slices: list[SliceMetricsM] = []
    role: Str | None = None  # schema 4: the output's role, how it was chosen, its role's metrics
    role_source: Str | None = None
    metrics: Free | None = None


class VerificationM(Table):
    max_abs_error: Real = None
    mean_abs_error: Real = None
    cosine_similarity: Real = None
    top1_agreement: Real = None
    samples: Int
    accuracy: Real = None
    reference_accuracy: Real = None
    task: Str | None = None
    task_source: Str | None = None
    task_metrics: Free | None = None
    outputs: list[OutputMetricsM] | None = None
    worst: Str | None = None
    vacuous: Str | None = None
    user_metric: Free | None = None


class SliceCheckM(Table):
    output: Int
    name: Str
    axis: Int
    runs: list[Run]
    float_range: Number
    max_error: Number


class GoldenM(Table):
    outputs: Str
    atol: Number
    slices: list[SliceCheckM] | None = None
    reference: Str | None = None


def _slice_metrics(s: SliceMetricsM) -> SliceMetrics:
    return SliceMetrics(name=s.name, axis=s.axis, runs=tuple(s.runs), float_range=nan_if_null(s.float_range),
                        max_abs_error=nan_if_null(s.max_abs_error), mean_abs_error=nan_if_null(s.mean_abs_error))


def _output_metrics(o: OutputMetricsM) -> OutputMetrics:
    return OutputMetrics(name=o.name, index=o.index, max_abs_error=nan_if_null(o.max_abs_error),
                         mean_abs_error=nan_if_null(o.mean_abs_error), cosine_similarity=nan_if_null(o.cosine_similarity),
                         float_range=nan_if_null(o.float_range), slices=tuple(_slice_metrics(s) for s in o.slices),
                         role=o.role, role_source=o.role_source, metrics=o.metrics or {})


def read_verification(v: VerificationM) -> Verification:
    return Verification(
        max_abs_error=nan_if_null(v.max_abs_error), mean_abs_error=nan_if_null(v.mean_abs_error),
        cosine_similarity=nan_if_null(v.cosine_similarity), top1_agreement=float_or_none(v.top1_agreement),
        samples=v.samples,
        accuracy=float_or_none(v.accuracy), reference_accuracy=float_or_none(v.reference_accuracy), task=v.task,
        task_source=v.task_source, task_metrics=v.task_metrics or {},
        outputs=tuple(_output_metrics(o) for o in v.outputs or ()), worst=v.worst, vacuous=v.vacuous,
        user_metric=v.user_metric,
    )


def read_golden(g: GoldenM) -> Golden:
    slices = tuple(SliceCheck(output=s.output, name=s.name, axis=s.axis, runs=tuple(s.runs),
                              float_range=float(s.float_range), max_error=float(s.max_error))
                   for s in g.slices or ())
    return Golden(g.outputs, float(g.atol), slices=slices, reference=g.reference)
