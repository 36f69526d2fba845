"""The verdict on a verification record: :func:`failures_of` reads every way a record breaks a tolerance
(whole-model numbers, task metrics, role and slice limits, the user's metric) from the record alone, so the
convert stage that measured it and a caller holding only a manifest's record (``check --eval``) agree."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from toolkit.model import roles
from toolkit.model.artifact import Verification
from toolkit.model.records import OutputMetrics
from toolkit.model.tasks import Task
from toolkit.model.tolerance import Tolerance
from toolkit.verification import detection, role_metrics, segmentation


def failures_of(verification: Verification, tolerance: Tolerance) -> list[str]:
    """Every way ``verification`` breaks ``tolerance``, in plain words (empty when within it).

    Read from the record alone (whole-model numbers, task metrics, slices, the user's metric), so a caller
    holding only a manifest's record gets the same verdict as the stage that measured it."""
    v = verification
    if not math.isfinite(v.cosine_similarity) or not math.isfinite(v.max_abs_error):
        return ["outputs are NaN/Inf"]
    covered = set(v.user_metric.get("covers") or ()) if v.user_metric is not None else set()
    decoded = covered | {o.name for o in v.outputs if o.role == roles.Role.DETECTION_HEAD}  # tensor stats: info
    reasons: list[str] = []
    if not decoded and v.cosine_similarity < tolerance.min_cosine:
        hint = "".join(role_metrics.would_pass_hint(o.name, o.metrics) for o in v.outputs  # a head: no cosine
                       if len(v.outputs) == 1 and o.metrics.get("would_pass_as") == roles.Role.DETECTION_HEAD)
        reasons.append(f"cosine similarity {v.cosine_similarity:.4f} < {tolerance.min_cosine}{hint}")
    for out in v.outputs if decoded else ():  # the outputs judged by no decoded metric: each by its own cosine
        if out.name not in decoded and out.cosine_similarity < tolerance.min_cosine:
            reasons.append(f"{out.name}: cosine similarity {out.cosine_similarity:.4f} < {tolerance.min_cosine}")
    if not task_covered(v.task, [o.role for o in v.outputs], [o.name for o in v.outputs], covered):
        reasons += _task_failures(v, tolerance)
    return reasons + _output_failures(v, tolerance, covered, decoded) + _user_failures(v)


def task_covered(task: str | None, output_roles: Sequence[str | None], names: Sequence[str],
                  covered: Collection[str]) -> bool:
    """Whether --metric judges every output the task's own metrics read (then they gate nothing): a
    detector's decoded outputs, a classifier's, segmenter's or recognizer's first output, else all."""
    if not covered or not names:
        return False
    judged: Sequence[str] = names
    if task == Task.DETECTION:
        judged = [n for n, r in zip(names, output_roles)
                  if r in (roles.Role.DETECTION, roles.Role.DETECTION_HEAD)] or names[:1]
    elif task in (Task.CLASSIFICATION, Task.SEGMENTATION, Task.SEQUENCE):
        judged = names[:1]
    return all(n in covered for n in judged)


def _task_failures(v: Verification, tolerance: Tolerance) -> list[str]:
    """The task-level limits: top-1, detection, mask IoU, embedding cosine, relative error."""
    reasons: list[str] = []
    if v.accuracy is not None and v.reference_accuracy is not None:
        drop = v.reference_accuracy - v.accuracy
        if drop > tolerance.max_top1_drop + 1e-9:
            reasons.append(f"top-1 accuracy {v.accuracy:.3f} vs float {v.reference_accuracy:.3f} "
                           f"(drop {drop * 100:.1f} points > {tolerance.max_top1_drop * 100:.1f})")
    elif v.top1_agreement is not None and 1.0 - v.top1_agreement > tolerance.max_top1_drop + 1e-9:
        first = v.outputs[0] if v.outputs and (v.task_source or "").startswith("inferred") else None
        reasons.append(f"top-1 agreement with the float model {v.top1_agreement:.3f} "
                       f"(< {1 - tolerance.max_top1_drop:.3f})"
                       + (role_metrics.would_pass_hint(first.name, first.metrics) if first else ""))
    m = v.task_metrics
    if v.task == Task.DETECTION and isinstance(m.get("recall"), (int, float)) \
            and int(m.get("float_detections") or 0) >= detection.MIN_DETECTIONS:
        if m["recall"] < tolerance.min_recall:
            reasons.append(f"detection recall vs float {m['recall']:.3f} < {tolerance.min_recall} ({m['matched']} "
                           f"of {m['float_detections']} float detections found at IoU {detection.IOU})")
        if m["precision"] < tolerance.min_precision:
            reasons.append(f"detection precision vs float {m['precision']:.3f} < {tolerance.min_precision} "
                           f"({m['artifact_detections'] - m['matched']} of {m['artifact_detections']} unmatched)")
    if v.task == Task.DETECTION and isinstance(m.get("label_recall"), (int, float)) \
            and int(m.get("labelled_boxes") or 0) >= detection.MIN_DETECTIONS:
        for what, limit in (("recall", tolerance.max_label_recall_drop),
                            ("precision", tolerance.max_label_precision_drop)):
            own, base = float(m[f"label_{what}"]), float(m[f"reference_label_{what}"])
            if base - own > limit + 1e-9:
                reasons.append(f"detection {what} vs the labels {own:.3f}, the float model's {base:.3f} (drop "
                               f"{(base - own) * 100:.1f} points > {limit * 100:.1f}; {m['labelled_boxes']} "
                               "labelled boxes)")
    if v.task == Task.SEGMENTATION and isinstance(m.get("mean_iou"), (int, float)) \
            and float(m.get("foreground_fraction") or 0.0) >= segmentation.MIN_FOREGROUND \
            and m["mean_iou"] < tolerance.min_mask_iou:
        reasons.append(f"mask IoU vs float {m['mean_iou']:.3f} < {tolerance.min_mask_iou} "
                       f"(pixel agreement {m['pixel_agreement']:.3f})")
    if v.task == Task.EMBEDDING:
        for key, value in m.items():
            if key.endswith("mean_cosine") and isinstance(value, (int, float)) and value < tolerance.min_cosine:
                what = key.replace("mean_cosine", "mean per-vector cosine")
                reasons.append(f"{what} {value:.4f} < {tolerance.min_cosine}")
    sequence_error = m.get("sequence_relative_error")
    if isinstance(sequence_error, (int, float)) and sequence_error > tolerance.max_relative_error:
        reasons.append(f"relative error {sequence_error:.4f} over {m.get('sequence_steps')} steps with the state "
                       f"fed back ({m.get('sequence_state')}) > {tolerance.max_relative_error}")
    if v.task in (Task.EMBEDDING, Task.REGRESSION):
        for key, value in m.items():
            if key.endswith("relative_error") and isinstance(value, (int, float)) \
                    and value > tolerance.max_relative_error:
                reasons.append(f"{key.replace('_', ' ')} {value:.4f} > {tolerance.max_relative_error}")
    return reasons


def _output_failures(v: Verification, tolerance: Tolerance, covered: Collection[str],
                     decoded: Collection[str]) -> list[str]:
    """Each output's role limits, for the outputs --metric does not judge, and slice limits, for the outputs
    no decoded metric judges."""
    reasons: list[str] = []
    for out in v.outputs:
        if out.name in covered:
            continue
        if out.role and out.metrics and not _judged_by_task(v.task, out):
            reasons += role_metrics.failures(out.name, out.role, out.metrics, tolerance)
        for part in out.slices if out.name not in decoded else ():
            if part.max_error_ratio > tolerance.max_slice_error:
                reasons.append(f"{part.name}: max error {part.max_abs_error:.4g} is {part.max_error_ratio:.0%} of its "
                               f"float range {part.float_range:.4g} (> {tolerance.max_slice_error:.0%})")
    return reasons


def _user_failures(v: Verification) -> list[str]:
    if v.user_metric is None or v.user_metric.get("ok"):
        return []
    values = v.user_metric.get("values") or {}
    shown = ", ".join(f"{k} {val:.4g}" for k, val in values.items() if isinstance(val, (int, float)))
    return [f"--metric {v.user_metric.get('metric')} says not ok ({shown or 'no values'})"]


# the model-level metric that already judges an output of this role (its failure is not said twice)
_SAME_KIND: dict[Task, tuple[roles.Role, tuple[int, ...] | None]] = {
    Task.CLASSIFICATION: (roles.Role.CLASSIFICATION, (0,)), Task.SEGMENTATION: (roles.Role.DENSE, (0,)),
    Task.EMBEDDING: (roles.Role.EMBEDDING, None), Task.REGRESSION: (roles.Role.REGRESSION, None)}


def _judged_by_task(task: str | None, out: OutputMetrics) -> bool:
    if not task:
        return False
    try:
        role, indices = _SAME_KIND[Task(task)]
    except (KeyError, ValueError):
        return False
    return out.role == role and (indices is None or out.index in indices)
