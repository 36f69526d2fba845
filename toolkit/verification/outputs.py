"""The one call the convert stage makes per candidate artifact: :func:`verify_outputs`.

It compares the artifact's outputs with the float model's on the held-out inputs: per output, per slice of
outputs that mix ranges (:mod:`.slices`), and with the metrics of the model's task (given, or inferred from
the outputs); it applies the :class:`~toolkit.model.tolerance.Tolerance` to all of them and refuses a
vacuous verdict (float outputs that do not vary, too few samples or detections), which the stage records as
``unverified`` rather than ``ok``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toolkit.model.artifact import Verification
from toolkit.verification import dense, detection, detection_head, role_metrics, slices
from toolkit.model import roles
from toolkit.model.records import JsonDict, OutputMetrics, SliceMetrics
from toolkit.verification.sequence import RecurrentRun
from toolkit.model.tasks import Task, TaskChoice, parse_task
from toolkit.verification.inference import alternatives, assign, head_role, infer_task, objectness, output_name
from toolkit.verification.task_metrics import measure_task
from toolkit.model.tolerance import Tolerance
from toolkit.verification.user_metric import UserMetric, evaluate
from toolkit.verification.verdict import failures_of, task_covered

Outputs = Sequence[np.ndarray]
CONSTANT_SPREAD = 1e-4  # float outputs whose spread over the eval set is below this fraction of their size


@dataclass(frozen=True)
class VerificationResult:
    """What verification found: the manifest's record, every tolerance broken, and whether it proves anything."""

    verification: Verification
    failures: tuple[str, ...] = ()  # each broken tolerance in plain words; empty when within tolerance
    vacuous: str | None = None  # why these numbers prove nothing (the artifact is not ``ok`` on accuracy)

    @property
    def ok(self) -> bool:
        return not self.failures and self.vacuous is None

    @property
    def task(self) -> str | None:
        return self.verification.task

    @property
    def worst(self) -> str | None:
        return self.verification.worst


def _stack(per_sample: Sequence[Outputs], count: int,
           shapes: Sequence[tuple[int, ...]] | None = None) -> list[np.ndarray]:
    stacked = []
    for k in range(count):
        arrays = [np.asarray(outs[k]) for outs in per_sample]
        if shapes is not None:
            arrays = [a.reshape(shapes[k]) if a.size == int(np.prod(shapes[k])) else a for a in arrays]
        stacked.append(np.stack(arrays).astype(np.float32))
    return stacked


def _vacuous_spread(ref: Sequence[np.ndarray]) -> str | None:
    """Why the float outputs say nothing: the same for every eval input (None when they vary)."""
    worst = 0.0
    for r in ref:
        if r.shape[0] < 2 or not r.size:
            continue
        scale = float(np.max(np.abs(r))) or 1.0
        worst = max(worst, float(np.max(np.ptp(r, axis=0))) / scale)
    if worst < CONSTANT_SPREAD:
        return (f"the float model gives (nearly) the same outputs for every eval input (spread {worst:.1e} of "
                "their size): any artifact would match them; verify on real, varied inputs (--eval-data), and "
                "for random-weight models re-estimate BatchNorm statistics first")
    return None


def _stacked_pair(reference: Sequence[Outputs], candidate: Sequence[Outputs],
                  output_names: Sequence[str]) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
    """Both sides stacked per output (``[samples, ...]``, the artifact's in the float shapes), and the
    outputs' names; a ValueError when the two do not pair up."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(candidate)} samples of artifact outputs for {len(reference)} float ones")
    count = len(reference[0]) if reference else 0
    if reference and any(len(outs) != count for outs in candidate):
        raise ValueError(f"the artifact returns {len(candidate[0])} outputs, the float model {count}")
    ref = _stack(reference, count)
    act = _stack(candidate, count, [r.shape[1:] for r in ref])
    for k in range(count):
        if ref[k].shape != act[k].shape:
            raise ValueError(f"output {output_name(output_names, k)} sizes differ: {act[k].shape[1:]} vs {ref[k].shape[1:]}")
    return ref, act, [output_name(output_names, k) for k in range(count)]


def _whole_model(ref: Sequence[np.ndarray], act: Sequence[np.ndarray]) -> tuple[bool, float, float, float]:
    """All outputs as one vector: whether the artifact's are finite, max and mean absolute error, cosine."""
    ref_flat = np.concatenate([r.reshape(-1) for r in ref]) if ref else np.zeros(0)
    act_flat = np.concatenate([a.reshape(-1) for a in act]) if act else np.zeros(0)
    finite = bool(np.all(np.isfinite(act_flat)))
    diff = np.abs(ref_flat.astype(np.float64) - act_flat.astype(np.float64))
    max_abs = (float(diff.max()) if diff.size else 0.0) if finite else math.nan
    mean_abs = (float(diff.mean()) if diff.size else 0.0) if finite else math.nan
    return finite, max_abs, mean_abs, slices.cosine(ref_flat, act_flat)


def _choose_task(task: Task | TaskChoice | str | None, task_source: str | None, recurrent: RecurrentRun | None,
                 ref: list[np.ndarray], names: list[str]) -> tuple[TaskChoice, list[roles.OutputRole]]:
    """The task (declared, else inferred) and every output's role under it: a detector's decoded outputs are
    judged together, a task the user named gives its role to the outputs no declaration covers."""
    declared = task.outputs if isinstance(task, TaskChoice) else ()
    roles.check_names(declared, names)
    state = [p.output for p in recurrent.pairs] if recurrent is not None else []
    output_roles = assign(ref, names, declared, state=state)
    if isinstance(task, TaskChoice) and task.task is not None:
        choice = task
    else:
        chosen = parse_task(task) if not isinstance(task, TaskChoice) else None
        if chosen is not None:
            choice = TaskChoice(chosen, task_source or "--task")
        elif recurrent is not None:
            choice = TaskChoice(Task.RECURRENT, "inferred: state fed back ("
                                + ", ".join(p.label(names) for p in recurrent.pairs) + ")")
        else:
            choice = infer_task(ref, names, output_roles)
    if choice.task is Task.DETECTION:  # the outputs that decode as boxes and scores are judged together
        output_roles = _detector_roles(ref, names, declared, state, choice.source)
    elif not choice.source.startswith("inferred") and choice.task in _TASK_ROLE:  # the user's task: its role
        role, first_only = _TASK_ROLE[choice.task]
        named = {d.output for d in declared}
        covered = [n for n in (names[:1] if first_only else names) if n not in named]
        output_roles = assign(ref, names, (*declared, *(roles.OutputDeclaration(n, role, choice.source)
                                                        for n in covered)), state=state)
    return choice, output_roles


def _detector_roles(ref: list[np.ndarray], names: list[str], declared: Sequence[roles.OutputDeclaration],
                    state: Sequence[int], source: str) -> list[roles.OutputRole]:
    """A detector's roles: a declared raw head, or one inferred with objectness; else a decoded YOLO head or SSD
    pair (judged together by the task's metrics); else a raw head read from the values (logits allowed: the
    task says it is a detector)."""
    inferred = assign(ref, names, declared, state=state)
    if any(d.role is roles.Role.DETECTION_HEAD for d in declared) or any(objectness(r) for r in inferred):
        return inferred  # a declared head, or one with objectness (YOLOv5's [N, 85] is no [N, 4+C] head)
    decoded: tuple[int, ...] = ()
    if detection.yolo_layout(ref[0]) is not None:
        decoded = (0,)
    else:
        ssd = detection.ssd_layout(ref, names)
        decoded = (ssd.boxes, ssd.scores) if ssd is not None else ()
    found = assign(ref, names, declared, decoded=decoded, state=state)
    if decoded or any(r.role is roles.Role.DETECTION_HEAD for r in found):
        return found
    named = {d.output for d in declared}
    for k, stacked in enumerate(ref):
        head = detection_head.infer(stacked, loose=True) if names[k] not in named else None
        if head is not None:
            found[k] = head_role(head, f"inferred under {source}")
            break
    return found


def _too_little(samples: int, ref: Sequence[np.ndarray], tolerance: Tolerance) -> list[str]:
    """Why the eval data cannot back a verdict: too few samples, or float outputs that never vary."""
    vacuous: list[str] = []
    if samples < tolerance.min_samples:
        vacuous.append(f"only {samples} eval sample(s): the verdict needs at least {tolerance.min_samples} "
                       "(tolerance.min_samples); pass more with --eval-data or --calibration")
    spread = _vacuous_spread(ref) if samples >= 2 else None
    if spread:
        vacuous.append(spread)
    return vacuous


def verify_outputs(
    reference: Sequence[Outputs],
    candidate: Sequence[Outputs],
    *,
    tolerance: Tolerance,
    task: Task | TaskChoice | str | None = None,
    task_source: str | None = None,
    labels: np.ndarray | None = None,
    metric: UserMetric | None = None,
    output_names: Sequence[str] = (),
    score_threshold: float | None = None,
    recurrent: RecurrentRun | None = None,
    anchors: np.ndarray | None = None,
) -> VerificationResult:
    """Metrics of ``candidate`` (one list of outputs per sample) against ``reference`` (the float model's).

    ``task`` None infers it from the float outputs (the manifest says how it was chosen); ``labels`` are the
    eval data's ``y`` (one class per sample); ``metric`` a loaded ``--metric`` that gates as well;
    ``recurrent`` the float and artifact outputs over the held-out samples run as one sequence with the
    state fed back (a step model), judged by their relative error; ``anchors`` an SSD model's anchor table
    ``[N, 4]`` (cx, cy, sx, sy) to match its boxes to labelled ones (else a known scheme, else none).
    """
    ref, act, names = _stacked_pair(reference, candidate, output_names)
    samples, count = len(reference), len(ref)
    finite, max_abs, mean_abs, cosine = _whole_model(ref, act)
    choice, output_roles = _choose_task(task, task_source, recurrent, ref, names)
    assert choice.task is not None  # declared or inferred by now
    per_output = [_alternative(_output(ref[k], act[k], names[k], k, output_roles[k]), ref[k], act[k],
                               output_roles[k], tolerance) for k in range(count)]
    vacuous = _too_little(samples, ref, tolerance)
    task_metrics: JsonDict = {}
    task_vacuous: list[str] = []  # why the task's own metrics prove nothing (moot where --metric judges)
    top1 = accuracy = reference_accuracy = None
    if finite and count:
        heads = [o for o in per_output if o.role == roles.Role.DETECTION_HEAD]
        task_vacuous += [why for why in (detection_head.too_few(o.name, o.metrics) for o in heads) if why]
        if not heads or choice.task is not Task.DETECTION:  # a raw head's own metrics judge the detector
            measure_task(choice.task, ref, act, names, labels, score_threshold, task_metrics, task_vacuous, anchors)
        top1 = task_metrics.get("top1_agreement")
        accuracy = task_metrics.get("accuracy")
        reference_accuracy = task_metrics.get("reference_accuracy")
    if recurrent is not None and recurrent.candidate is not None and finite:
        task_metrics.update(_sequence_metrics(recurrent, names, ref, act))
    elif choice.task is Task.RECURRENT:
        task_vacuous.append("--task recurrent, but no input takes an output back (a state input and output of "
                            "one shape, named state/hidden/cell/h/c): pass --metric for this model")
    user = evaluate(metric, ref, act, labels, names) if metric is not None and count else None
    if user is not None and task_covered(choice.task.value, [o.role for o in per_output], names, user.covers):
        if task_vacuous:  # the user's metric judges the task's outputs: the built-in metrics' gaps are moot
            task_metrics["not_judged"] = "; ".join(task_vacuous) + f" (judged by --metric {user.spec} instead)"
        task_vacuous = []
    vacuous += task_vacuous

    verification = Verification(
        max_abs_error=max_abs,
        mean_abs_error=mean_abs,
        cosine_similarity=cosine,
        top1_agreement=top1,
        samples=samples,
        accuracy=accuracy,
        reference_accuracy=reference_accuracy,
        task=choice.task.value,
        task_source=choice.source,
        task_metrics=task_metrics,
        outputs=tuple(per_output),
        worst=_worst(per_output),
        vacuous="; ".join(vacuous) or None,
        user_metric=user.to_dict() if user else None,
    )
    return VerificationResult(verification, tuple(failures_of(verification, tolerance)), verification.vacuous)


def _output(ref: np.ndarray, act: np.ndarray, name: str, index: int, role: roles.OutputRole) -> OutputMetrics:
    """One output's error (whole and per slice) with its role, how it was chosen, and its role's metrics."""
    whole = slices.output_metrics(ref, act, name=name, index=index)
    return dataclasses.replace(whole, role=role.role.value, role_source=role.source,
                               metrics=role_metrics.score(role, ref, act))


def _alternative(out: OutputMetrics, ref: np.ndarray, act: np.ndarray, role: roles.OutputRole,
                 tolerance: Tolerance) -> OutputMetrics:
    """An output whose inferred role (or cosine) fails: the first other role it would pass as
    (``would_pass_as``, and ``would_pass_declare``: the ``--output-task`` value), so the reason can say what to
    declare. Declared roles are the user's word and get no alternative."""
    if not out.role:
        return out
    failed = bool(role_metrics.failures(out.name, out.role, out.metrics, tolerance))
    if not failed and out.cosine_similarity >= tolerance.min_cosine:
        return out
    for other in alternatives(role, ref):  # a raw head is not gated by cosine: it may rescue a cosine failure
        if not failed and other.role is not roles.Role.DETECTION_HEAD:
            continue
        if not role_metrics.failures(out.name, other.role.value, role_metrics.score(other, ref, act), tolerance):
            declare = {"would_pass_declare": f"{out.name}={other.role.value}{other.head.options()}"} \
                if other.head is not None else {}
            return dataclasses.replace(out, metrics={**out.metrics, "would_pass_as": other.role.value, **declare})
    return out


# a declared task's role for the outputs it covers (True: the first output only)
_TASK_ROLE = {Task.CLASSIFICATION: (roles.Role.CLASSIFICATION, True), Task.SEGMENTATION: (roles.Role.DENSE, True),
              Task.SEQUENCE: (roles.Role.SEQUENCE, True), Task.EMBEDDING: (roles.Role.EMBEDDING, False),
              Task.REGRESSION: (roles.Role.REGRESSION, False)}
def _worst(per_output: Sequence[OutputMetrics]) -> str | None:
    """The output or slice with the largest error relative to its float range, named."""
    best: tuple[float, str] | None = None
    for out in per_output:
        parts: list[OutputMetrics | SliceMetrics] = [*out.slices] or [out]
        for part in parts:
            ratio = part.max_error_ratio
            key = ratio if math.isfinite(ratio) else math.inf
            if best is None or key > best[0]:
                best = (key, f"{part.name}: max error {part.max_abs_error:.4g} ({ratio:.1%} of its float range "
                             f"{part.float_range:.4g})")
    return best[1] if best else None


def _sequence_metrics(recurrent: RecurrentRun, names: Sequence[str], ref: list[np.ndarray],
                      act: list[np.ndarray]) -> JsonDict:
    """Relative error of every output over the sequence (state fed back), its last quarter, and the same
    outputs on independent steps for contrast."""
    assert recurrent.candidate is not None
    count = len(ref)
    seq_ref = _stack(recurrent.reference, count)
    seq_act = _stack(recurrent.candidate, count, [r.shape[1:] for r in seq_ref])
    steps = seq_ref[0].shape[0] if seq_ref else 0
    tail = max(1, steps // 4)
    whole = max(dense.relative_error(r, a) for r, a in zip(seq_ref, seq_act))
    last = max(dense.relative_error(r[-tail:], a[-tail:]) for r, a in zip(seq_ref, seq_act))
    independent = max(dense.relative_error(r, a) for r, a in zip(ref, act))
    return {"sequence_steps": steps, "sequence_state": ", ".join(p.label(names) for p in recurrent.pairs),
            "sequence_relative_error": whole, "sequence_relative_error_last_quarter": last,
            "step_relative_error_without_feedback": independent}
