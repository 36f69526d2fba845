"""Run a .tflite artifact on this host in ai-edge-litert (runtime name ``litert``).

The interpreter is built and its tensors allocated once; every ``run`` after that only copies data in and
out, so host timing measures inference and not set-up. Inputs and outputs carry the names of the model's
signature (``image``, not ``serving_default_image:0``), so feeds keyed by the source's input names work.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import MissingDependency, UsageError, key_line
from toolkit.model.vocabulary import Runtime
from toolkit.runtimes.execution import HostSession
from toolkit.runtimes.inspection.tflite import parse_tflite


def _interpreter_class() -> Any:  # Any: the runtime's untyped Interpreter class
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError as exc:
        raise MissingDependency("ai-edge-litert", extra="litert", purpose="Running a .tflite model") from exc
    return Interpreter


class TFLiteSession(HostSession):
    """A .tflite model loaded in ai-edge-litert, allocated once and reused for many runs."""

    runtime = Runtime.LITERT

    def __init__(self, path: Path, *, threads: int | None = None) -> None:
        self.path = Path(path)
        contents = parse_tflite(self.path)  # UsageError for anything that is not a TFLite model
        self._inputs = contents.inputs
        self._outputs = contents.outputs
        self._input_indices = contents.input_indices
        self._output_indices = contents.output_indices
        self.threads = threads
        interpreter = _interpreter_class()
        try:
            self._interpreter = interpreter(model_path=str(self.path), num_threads=threads)
            self._interpreter.allocate_tensors()
        except (RuntimeError, ValueError) as exc:
            raise UsageError(
                f"LiteRT cannot load {self.path.name}: {key_line(exc)}",
                hint="The model may need ops this runtime lacks; convert it again with built-in ops only.",
            ) from None
        self._shapes: dict[int, tuple[int, ...]] = {
            d["index"]: tuple(int(x) for x in d["shape"]) for d in self._interpreter.get_input_details()
        }

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self._check_names(feeds)
        return super().run(feeds)

    def _check_names(self, feeds: Mapping[str, np.ndarray]) -> None:
        missing = [s.name for s in self._inputs if s.name not in feeds]
        if missing:
            raise UsageError(
                f"No data for input(s) {', '.join(missing)} of {self.path.name}.",
                hint=f"Feed every input: {', '.join(s.name for s in self._inputs)}.",
            )

    def run_raw(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self._check_names(feeds)
        resized = False
        for spec, index in zip(self._inputs, self._input_indices):
            value = np.asarray(feeds[spec.name])
            if tuple(value.shape) != self._shapes.get(index):
                if not _fits(spec.shape, value.shape):
                    raise UsageError(
                        f"Input {spec.name!r} of {self.path.name} takes shape {_fmt(spec.shape)}, got "
                        f"{tuple(value.shape)}.",
                        hint="Feed data shaped like the artifact's input.",
                    )
                self._interpreter.resize_tensor_input(index, list(value.shape), strict=True)
                self._shapes[index] = tuple(value.shape)
                resized = True
        if resized:
            self._interpreter.allocate_tensors()
        for spec, index in zip(self._inputs, self._input_indices):
            self._interpreter.set_tensor(
                index, np.ascontiguousarray(feeds[spec.name], dtype=np.dtype(spec.dtype))
            )
        self._interpreter.invoke()
        return [np.array(self._interpreter.get_tensor(index)) for index in self._output_indices]

    def close(self) -> None:
        self._interpreter = None


def _fits(expected: tuple[int | None, ...], got: tuple[int, ...]) -> bool:
    return len(expected) == len(got) and all(e is None or e == g for e, g in zip(expected, got))


def _fmt(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
