"""PyTorch sources: TorchScript files, ExportedProgram (.pt2) files, and Python factories of eager modules.

SOURCE forms (``detect.py`` decides which; ``torch_open`` loads them):

- ``model.pt`` / ``model.jit``: TorchScript, loaded with ``torch.jit.load``;
- ``model.pt2``: an ExportedProgram, loaded with ``torch.export.load``;
- ``path/to/file.py:make_model`` or ``pkg.module:make_model``: a factory called with no arguments that returns
  an ``nn.Module`` (put in eval mode here). ``--weights FILE`` loads a state dict into it
  (``torch.load(weights_only=True)``, then a strict ``load_state_dict``).

Inputs. Names come from the model's ``forward`` parameters (TorchScript: its schema; ExportedProgram: its
user inputs). Shapes and dtypes come from the model where it records them: an ExportedProgram carries them
(a dynamic dimension becomes ``None``). TorchScript and eager modules do not; a factory may say them itself
in either of two ways, checked in this order:

- the factory's module defines ``example_inputs()`` returning a tensor, a tuple of tensors (in ``forward``
  order) or a dict name -> tensor;
- the returned module has ``example_input_shapes = {"x": (1, 1, 8, 8)}`` (float32 assumed) or
  ``{"x": ((1, 16), "int64")}``.

Otherwise an input's rank is unknown and its spec is ``TensorSpec(name, (None,), "float32")``; the convert
stage must then have ``--input-shape NAME=D0,D1,...`` (``require_input_shapes`` says so in one message).
Outputs are named ``output`` (one output) or ``output_0``, ``output_1``, ... (nested tuples/lists/dicts are
flattened in order); their specs come from one probe run on zeros once the input shapes are known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.errors import MissingDependency, UsageError, key_line
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import Framework
from toolkit.sources.base import SourceModel

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor, nn
    from torch.export import ExportedProgram

UNKNOWN_RANK: tuple[int | None, ...] = (None,)


def import_torch(purpose: str = "Loading a PyTorch model") -> ModuleType:
    """``torch``, or a MissingDependency naming the extra that brings it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the test environment has torch
        raise MissingDependency("torch", extra="torch", purpose=purpose) from exc
    return torch


def output_names(count: int) -> tuple[str, ...]:
    """The names every PyTorch route gives the model's outputs, in order."""
    return ("output",) if count == 1 else tuple(f"output_{i}" for i in range(count))


def flatten_outputs(value: Any) -> list[Any]:  # Any: torch tensors, nested
    """Tensors of a forward() result in order: tuples/lists/dicts (by insertion order) are flattened."""
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in flatten_outputs(item)]
    if isinstance(value, Mapping):
        return [t for item in value.values() for t in flatten_outputs(item)]
    if value is None:
        return []
    return [value]


class TorchSource(SourceModel):
    """A loaded PyTorch model (eager, TorchScript or ExportedProgram) and its float reference outputs."""

    def __init__(
        self,
        *,
        framework: Framework,
        path: Path,
        module: nn.Module,
        inputs: tuple[TensorSpec, ...],
        exported_program: ExportedProgram | None = None,
    ) -> None:
        self.framework = framework
        self.path = path
        self.module = module  # callable: nn.Module, ScriptModule, or ExportedProgram.module()
        self.exported_program = exported_program
        self._inputs = inputs
        self._probed: tuple[TensorSpec, ...] | None = None  # the outputs, once a run has shown them

    def adopt_input_dtypes(self, dtypes: Mapping[str, str]) -> None:
        """Integer data for an input whose rank and dtype the model does not record (``float32`` was only
        assumed): the input takes that dtype, so token ids reach an embedding as integers."""
        self._inputs = tuple(
            TensorSpec(spec.name, spec.shape, dtypes[spec.name], spec.quantization)
            if spec.shape == UNKNOWN_RANK and spec.name in dtypes and np.issubdtype(np.dtype(dtypes[spec.name]), np.integer)
            else spec
            for spec in self._inputs
        )

    @property
    def input_shapes_known(self) -> bool:
        """True when every input's shape is recorded (dynamic dimensions as None are allowed)."""
        return all(spec.shape != UNKNOWN_RANK for spec in self._inputs)

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """Output specs from a probe run on zeros (batch dimension kept as the model returns it).

        While the input shapes are unknown this returns ``()`` until ``predict`` or ``probe_outputs`` has run.
        """
        if self._probed is None and self.input_shapes_known:
            self.probe_outputs({s.name: tuple(1 if d is None else d for d in s.shape) for s in self._inputs})
        return self._probed or ()

    def probe_outputs(self, input_shapes: Mapping[str, Sequence[int]]) -> tuple[TensorSpec, ...]:
        """Run once on zeros of ``input_shapes`` to learn the outputs' count, shapes and dtypes."""
        feeds = {
            spec.name: np.zeros(tuple(input_shapes[spec.name]), dtype=np.dtype(spec.dtype))
            for spec in self._inputs
        }
        self.predict(feeds)
        return self._probed or ()

    def torch_inputs(self, feeds: Mapping[str, np.ndarray]) -> tuple[Tensor, ...]:
        """Feeds as tensors in ``forward`` order; a missing input is a UsageError."""
        torch = import_torch()
        args = []
        for spec in self._inputs:
            if spec.name not in feeds:
                raise UsageError(
                    f"No data for the model input {spec.name!r} (got: {', '.join(sorted(feeds)) or 'nothing'}).",
                    hint="Name the calibration/eval arrays after the model's inputs.",
                )
            args.append(torch.from_numpy(np.ascontiguousarray(feeds[spec.name])))
        return tuple(args)

    def predict(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        torch = import_torch()
        args = self.torch_inputs(feeds)
        with torch.no_grad():
            try:
                result = self.module(*args)
            except Exception as exc:
                if not self.input_shapes_known:
                    unknown = [s.name for s in self._inputs if s.shape == UNKNOWN_RANK]
                    error = missing_shape_error(self, unknown)
                    raise UsageError(
                        f"{error.message} It failed on the shapes guessed: {key_line(exc)}", hint=error.hint
                    ) from exc
                shapes = ", ".join(f"{s.name}={tuple(a.shape)}" for s, a in zip(self._inputs, args))
                raise UsageError(
                    f"The PyTorch model failed on inputs {shapes}: {key_line(exc)}",
                    hint="Check --input-shape NAME=D0,D1,... against what the model's forward() expects.",
                ) from exc
        tensors = flatten_outputs(result)
        arrays = [t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in tensors]
        if self._probed is None or len(self._probed) != len(arrays):
            names = output_names(len(arrays))
            self._probed = tuple(
                TensorSpec(name, (None, *a.shape[1:]) if a.ndim else (), str(a.dtype))
                for name, a in zip(names, arrays)
            )
        return arrays


def missing_shape_error(source: SourceModel, names: Sequence[str]) -> UsageError:
    flags = " ".join(f"--input-shape {n}=D0,D1,..." for n in names)
    return UsageError(
        f"The {source.framework} model {str(source.path)!r} does not record the shape of its input(s) "
        f"{', '.join(repr(n) for n in names)}, and none was given.",
        hint=f"Pass {flags} (e.g. --input-shape {names[0]}=1,3,224,224), or have the factory set "
        "model.example_input_shapes / define example_inputs().",
    )
