"""Knowledge distillation: train the student (SOURCE) on the teacher's softened outputs plus the labels.

The teacher (any Keras 3 or PyTorch model ``optimize`` can open) runs once over the training data; its logits
(log of its outputs when it ends in softmax) become soft targets for the shared fine-tune loop, whose loss is
``alpha * CE(labels) + (1 - alpha) * T^2 * KL(softmax(teacher/T) || softmax(student/T))``.
"""

from __future__ import annotations


import numpy as np

from toolkit.model.vocabulary import Framework
from toolkit.errors import UsageError
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.measure import count_params
from toolkit.optimization.training import Distillation, FineTuneConfig, fine_tune, outputs_are_probabilities


def distill(student: models.OptimizableModel, *, teacher_source: str, train_data: LabelledData | None,
            config: FineTuneConfig, temperature: float = 4.0, alpha: float = 0.3) -> dict[str, object]:
    if train_data is None or config.epochs < 1:
        raise UsageError("Distillation trains the student, so it needs training data and at least one epoch.",
                         hint="Pass --train-data FILE.npz (inputs and labels 'y') and --epochs N (N >= 1).")
    if temperature <= 0:
        raise UsageError(f"The distillation temperature must be > 0, got {temperature}.")
    if not 0.0 <= alpha <= 1.0:
        raise UsageError(f"The hard-label weight alpha must lie in [0, 1], got {alpha}.")
    teacher = models.load(teacher_source)
    teacher.example = student.example if teacher.kind != Framework.EXPORTED_PROGRAM else teacher.example
    teacher_out = models.predict(teacher, train_data.inputs)
    student_out = models.predict(student, train_data.first(2))
    if teacher_out.shape[1:] != student_out.shape[1:]:
        raise UsageError(
            f"The student's output shape {list(student_out.shape[1:])} does not match the teacher's "
            f"{list(teacher_out.shape[1:])}.",
            hint="Distillation needs a student that predicts the same classes as the teacher.",
        )
    logits = teacher_out.reshape(len(teacher_out), -1)
    if outputs_are_probabilities(logits):
        logits = np.log(np.clip(logits, 1e-7, 1.0))
    loss = fine_tune(student, train_data, config=config,
                     distill=Distillation(teacher_logits=logits, temperature=temperature, alpha=alpha))
    teacher_params, _ = count_params(teacher)
    student_params, _ = count_params(student)
    return {
        "teacher": teacher_source,
        "teacher_params": teacher_params,
        "student_params": student_params,
        "temperature": temperature,
        "alpha": alpha,
        "final_loss": round(loss, 5),
    }
