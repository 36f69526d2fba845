"""The float ONNX base's own transforms, each one checked: a transform that breaks the model is skipped.

``onnx_quant.prepare`` pins the inputs, turns Constant nodes into initializers, names nodes, infers shapes and
writes the graph outputs' shapes. On ordinary graphs all of them together keep the model computing what the
source does, and one check of the result (``onnx_quant.transform_problem``) proves it. When that check fails
(control flow such as an LSTM inside an ``If`` can trip onnxruntime's own shape checks once shapes are pinned
or inferred), the transforms are redone one at a time from the untransformed model, each checked, and the one
that breaks the model is skipped and named in the notes: the user's model loads, so the failure is this
stage's, and the message says which transform it was, never "the model".
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.conversion.base import ConversionRequest
from toolkit.errors import ConversionError

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class Transform:
    """One of the base's transforms: ``apply`` changes the model in place and appends its notes."""

    name: str  # how notes and messages name it ("ONNX shape inference")
    apply: Callable[[onnx.ModelProto, list[str]], None]


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    from toolkit.conversion.onnx_io import require_onnx

    copy = require_onnx().ModelProto()
    copy.CopyFrom(model)
    return copy


def apply_checked(model: onnx.ModelProto, transforms: Sequence[Transform], request: ConversionRequest,
                  notes: list[str], *,
                  problem_of: Callable[[onnx.ModelProto, ConversionRequest], str | None]) -> onnx.ModelProto:
    """``model`` with every transform that keeps it computing what the source does (``notes`` say which were
    skipped and why; ``problem_of`` is the check: ``onnx_quant``'s model-vs-source comparison). Raises
    :class:`ConversionError` naming the source when even the untransformed model fails: then the problem is the
    user's model, not a transform."""
    together = _copy(model)
    local: list[str] = []
    for transform in transforms:
        transform.apply(together, local)
    if problem_of(together, request) is None:
        notes.extend(local)
        return together
    problem = problem_of(model, request)
    if problem is not None:
        raise ConversionError(
            f"The source model {Path(request.source.path).name} itself {problem}, before any transform of this "
            "stage.", hint="Check that the model loads and runs in onnxruntime; re-export it if it does not.")
    current = model
    for transform in transforms:
        attempt, step_notes = _copy(current), list[str]()
        try:
            transform.apply(attempt, step_notes)
        except ConversionError as exc:
            notes.append(f"{transform.name} skipped: {exc.message}")
            continue
        problem = problem_of(attempt, request)
        if problem is None:
            current = attempt
            notes.extend(step_notes)
        else:
            notes.append(f"{transform.name} skipped: this stage's transformed model {problem} "
                         "(the source model does not); the model is used without it")
    return current


def fill_output_shapes(fill: Callable[[onnx.ModelProto, Path], None]) -> Callable[[onnx.ModelProto, list[str]], None]:
    """``onnx_quant._fill_output_shapes`` as a transform: it reads the shapes from a saved copy."""
    from toolkit.conversion.onnx_io import save_model

    def apply(model: onnx.ModelProto, notes: list[str]) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "shapes.onnx"
            save_model(model, path, final_name=path.name)
            fill(model, path)

    return apply
