"""The model-level metrics of a task (classification, detection, segmentation, embedding, regression): what
:func:`toolkit.verification.outputs.verify_outputs` adds beside the per-output ones, and why a verdict on them
would say nothing."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from toolkit.model.records import JsonDict
from toolkit.model.tasks import Task
from toolkit.verification import dense, detection, segmentation


def _label_metrics(out: JsonDict, truth: list[list[tuple[int, np.ndarray, float]]],
                   reference: list[list[tuple[int, np.ndarray, float]]],
                   candidate: list[list[tuple[int, np.ndarray, float]]]) -> None:
    """The float model's and the artifact's recall/precision against the labelled boxes."""
    ref, act = detection.score_against(truth, reference), detection.score_against(truth, candidate)
    out.update({"labelled_boxes": ref.labelled, "reference_label_recall": ref.recall,
                "reference_label_precision": ref.precision, "label_recall": act.recall,
                "label_precision": act.precision, "label_detections": act.detections,
                "reference_label_detections": ref.detections})


def measure_task(task: Task, ref: list[np.ndarray], act: list[np.ndarray], names: Sequence[str],
                  labels: np.ndarray | None, score_threshold: float | None,
                  out: JsonDict, vacuous: list[str], anchors: np.ndarray | None = None) -> None:
    """Fill ``out`` with the task's metrics; append why a verdict on them would be vacuous."""
    if task is Task.CLASSIFICATION:
        out.update(dense.classification_metrics(ref[0], act[0], labels))
    elif task is Task.DETECTION:
        axis = detection.yolo_layout(ref[0])
        ssd = detection.ssd_layout(ref, names) if axis is None else None
        truth = detection.label_boxes(labels, ref[0].shape[0])
        if axis is not None:
            d = detection.yolo_metrics(ref[0], act[0], axis=axis, threshold=score_threshold)
            if truth is not None:  # labelled boxes: both models against them (the artifact's loss gates)
                _label_metrics(out, truth, detection.yolo_detections(ref[0], axis=axis, threshold=score_threshold),
                               detection.yolo_detections(act[0], axis=axis, threshold=score_threshold))
        elif ssd is not None:
            d = detection.ssd_metrics(ref, act, layout=ssd, threshold=score_threshold)
            table = detection.anchor_table(anchors, ssd, int(ref[ssd.boxes].shape[-1]))
            if table is not None:
                out["anchors"] = table.source
            if truth is not None and table is None:
                out["label_metrics"] = (f"not computed: the {ssd.anchors} box outputs are offsets from anchors this "
                                        "toolkit does not know; add the anchor table to the eval data (anchors "
                                        "[N, 4]: cx, cy, sx, sy; docs/verification.md)")
            elif truth is not None and table is not None:
                logits = bool(ref[ssd.scores].min() < -1e-3 or ref[ssd.scores].max() > 1 + 1e-3)
                _label_metrics(out, truth, *(detection.ssd_detections(o, layout=ssd, anchors=table,
                                                                      threshold=score_threshold, logits=logits)
                                             for o in (ref, act)))
        else:
            vacuous.append("--task detection, but the outputs are neither a YOLO-style [4+C, N] head, a raw head "
                           "([N, 4+1+C], [N, 4+C], [4+C, N]) nor separate box and score outputs: declare the head "
                           "(--output-task NAME=detection-head,layout=n_5c|n_4c|4c_n,boxes=cxcywh|xyxy|grid) "
                           "or pass --metric for this layout")
            return
        out.update(d.to_dict())
        if d.float_detections < detection.MIN_DETECTIONS:
            vacuous.append(f"the float model makes {d.float_detections} detection(s) over the eval set at score "
                           f"> {d.score_threshold}: recall needs at least {detection.MIN_DETECTIONS}")
    elif task is Task.SEGMENTATION:
        axis = segmentation.class_axis(ref[0].shape[1:])
        if axis is None:
            vacuous.append(f"--task segmentation, but the first output {list(ref[0].shape[1:])} is not a "
                           "[C, H, W] or [H, W, C] map: pass --metric for this layout")
            return
        s = segmentation.segmentation_metrics(ref[0], act[0], axis=axis)
        out.update(s.to_dict())
        if s.foreground_fraction < segmentation.MIN_FOREGROUND:
            vacuous.append(f"the float model's map is one class on {1 - s.foreground_fraction:.2%} of the eval "
                           "pixels: IoU says nothing; verify on inputs that contain the classes")
    elif task is Task.EMBEDDING:
        for k in range(len(ref)):
            prefix = "" if len(ref) == 1 else f"{names[k]}."
            out.update({prefix + key: value for key, value in dense.embedding_metrics(ref[k], act[k]).items()})
    elif task is Task.REGRESSION:
        out["relative_error"] = max(dense.relative_error(r, a) for r, a in zip(ref, act))
