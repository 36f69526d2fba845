"""PyTorch sources: TorchScript files, ExportedProgram (.pt2) files, and Python factories of eager modules.

SOURCE forms (``detect.py`` decides which):

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

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import MissingDependency, UsageError
from toolkit.sources.base import SourceModel
from toolkit.model.tensors import TensorSpec

_UNKNOWN_RANK: tuple[int | None, ...] = (None,)


def import_torch(purpose: str = "Loading a PyTorch model") -> Any:
    """``torch``, or a MissingDependency naming the extra that brings it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the test environment has torch
        raise MissingDependency("torch", extra="torch", purpose=purpose) from exc
    return torch


def output_names(count: int) -> tuple[str, ...]:
    """The names every PyTorch route gives the model's outputs, in order."""
    return ("output",) if count == 1 else tuple(f"output_{i}" for i in range(count))


def flatten_outputs(value: Any) -> list[Any]:
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
        framework: str,
        path: Path,
        module: Any,
        inputs: tuple[TensorSpec, ...],
        exported_program: Any = None,
    ) -> None:
        self.framework = framework
        self.path = path
        self.module = module  # callable: nn.Module, ScriptModule, or ExportedProgram.module()
        self.exported_program = exported_program
        self._inputs = inputs
        self._outputs: tuple[TensorSpec, ...] | None = None

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    def adopt_input_dtypes(self, dtypes: Mapping[str, str]) -> None:
        """Integer data for an input whose rank and dtype the model does not record (``float32`` was only
        assumed): the input takes that dtype, so token ids reach an embedding as integers."""
        self._inputs = tuple(
            TensorSpec(spec.name, spec.shape, dtypes[spec.name], spec.quantization)
            if spec.shape == _UNKNOWN_RANK and spec.name in dtypes and np.issubdtype(np.dtype(dtypes[spec.name]), np.integer)
            else spec
            for spec in self._inputs
        )

    @property
    def input_shapes_known(self) -> bool:
        """True when every input's shape is recorded (dynamic dimensions as None are allowed)."""
        return all(spec.shape != _UNKNOWN_RANK for spec in self._inputs)

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """Output specs from a probe run on zeros (batch dimension kept as the model returns it).

        While the input shapes are unknown this returns ``()`` until ``predict`` or ``probe_outputs`` has run.
        """
        if self._outputs is None and self.input_shapes_known:
            self.probe_outputs({s.name: tuple(1 if d is None else d for d in s.shape) for s in self._inputs})
        return self._outputs or ()

    def probe_outputs(self, input_shapes: Mapping[str, Sequence[int]]) -> tuple[TensorSpec, ...]:
        """Run once on zeros of ``input_shapes`` to learn the outputs' count, shapes and dtypes."""
        feeds = {
            spec.name: np.zeros(tuple(input_shapes[spec.name]), dtype=np.dtype(spec.dtype))
            for spec in self._inputs
        }
        self.predict(feeds)
        return self._outputs or ()

    def require_input_shapes(self, given: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        """Concrete shapes for every input: ``given`` first, then the model's own (dynamic batch -> 1).

        Raises one UsageError listing every input whose shape is still unknown, with the flag to pass.
        """
        shapes: dict[str, tuple[int, ...]] = {}
        missing: list[str] = []
        for spec in self._inputs:
            if spec.name in given:
                shapes[spec.name] = tuple(int(d) for d in given[spec.name])
            elif spec.shape != _UNKNOWN_RANK and all(d is not None for d in spec.shape[1:]):
                shapes[spec.name] = tuple(1 if d is None else int(d) for d in spec.shape)
            else:
                missing.append(spec.name)
        if missing:
            raise missing_shape_error(self, missing)
        return shapes

    def torch_inputs(self, feeds: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
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
                    unknown = [s.name for s in self._inputs if s.shape == _UNKNOWN_RANK]
                    error = missing_shape_error(self, unknown)
                    raise UsageError(
                        f"{error.message} It failed on the shapes guessed: {first_line(exc)}", hint=error.hint
                    ) from exc
                shapes = ", ".join(f"{s.name}={tuple(a.shape)}" for s, a in zip(self._inputs, args))
                raise UsageError(
                    f"The PyTorch model failed on inputs {shapes}: {first_line(exc)}",
                    hint="Check --input-shape NAME=D0,D1,... against what the model's forward() expects.",
                ) from exc
        tensors = flatten_outputs(result)
        arrays = [t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in tensors]
        if self._outputs is None or len(self._outputs) != len(arrays):
            names = output_names(len(arrays))
            self._outputs = tuple(
                TensorSpec(name, (None, *a.shape[1:]) if a.ndim else (), str(a.dtype))
                for name, a in zip(names, arrays)
            )
        return arrays


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:400]


def missing_shape_error(source: SourceModel, names: Sequence[str]) -> UsageError:
    flags = " ".join(f"--input-shape {n}=D0,D1,..." for n in names)
    return UsageError(
        f"The {source.framework} model {str(source.path)!r} does not record the shape of its input(s) "
        f"{', '.join(repr(n) for n in names)}, and none was given.",
        hint=f"Pass {flags} (e.g. --input-shape {names[0]}=1,3,224,224), or have the factory set "
        "model.example_input_shapes / define example_inputs().",
    )


# --------------------------------------------------------------------------------------------- loading


def open_torch(source: str, framework: str, *, weights: Path | None) -> TorchSource:
    """Load a TorchScript file, an ExportedProgram file or a factory's eager module."""
    torch = import_torch()
    if weights is not None and framework != "torch_factory":
        raise UsageError(
            f"--weights applies to a factory source (file.py:make_model), not to a {framework} file: the weights "
            "are already inside it.",
            hint="Drop --weights, or pass the factory that builds the module.",
        )
    if framework == "torchscript":
        return _open_torchscript(torch, Path(source))
    if framework == "exported_program":
        return _open_exported_program(torch, Path(source))
    if framework == "torch_factory":
        return _open_factory(torch, source, weights)
    raise UsageError(f"{source!r} is not a PyTorch model ({framework}).")


def _open_torchscript(torch: Any, path: Path) -> TorchSource:
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        raise UsageError(
            f"{str(path)!r} is not a TorchScript model: {first_line(exc)}",
            hint="Save it with torch.jit.save(torch.jit.script(model) or torch.jit.trace(model, x), PATH), or "
            "pass a factory path/to/file.py:make_model with --weights FILE.",
        ) from exc
    module.eval()
    try:
        arguments = module.forward.schema.arguments[1:]
        names = [arg.name for arg in arguments]
    except Exception:  # noqa: BLE001  # pragma: no cover - every ScriptModule has a forward schema
        names = ["input"]
    specs = tuple(TensorSpec(name, _UNKNOWN_RANK, "float32") for name in names)
    return TorchSource(framework="torchscript", path=path, module=module, inputs=specs)


def _open_exported_program(torch: Any, path: Path) -> TorchSource:
    """``torch.export.load``. A program whose outputs are Hugging Face ``ModelOutput`` dataclasses loads only
    once transformers has registered those types with torch's pytree (``torch.export.save`` records the type
    by name): the load is retried after importing ``transformers.modeling_outputs``."""
    import warnings
    import zipfile

    if not zipfile.is_zipfile(path):  # torch.export.save writes a zip archive
        raise UsageError(
            f"{str(path)!r} is not an ExportedProgram (not a zip archive).",
            hint="Save one with torch.export.save(torch.export.export(model, args), 'model.pt2'), or pass a "
            "factory `file.py:make_model`.",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.load(str(path))
    except Exception as exc:
        program = _load_with_transformers_outputs(torch, path)
        if program is None:
            raise UsageError(
                f"{str(path)!r} could not be loaded as an ExportedProgram: {first_line(exc)}",
                hint="If the model returns a Hugging Face ModelOutput (a dataclass), install transformers (it "
                "registers those output types, then the file loads) or export a wrapper whose forward returns "
                "`model(...).to_tuple()` (tensors or a tuple). Otherwise save it with "
                "torch.export.save(torch.export.export(model, args), 'model.pt2').",
            ) from exc
    specs = exported_input_specs(torch, program)
    return TorchSource(
        framework="exported_program",
        path=path,
        module=program.module(),
        inputs=specs,
        exported_program=program,
    )


def _load_with_transformers_outputs(torch: Any, path: Path) -> Any:
    """The program loaded after transformers registered its ModelOutput types; None without transformers or
    when it still fails."""
    import warnings

    try:
        importlib.import_module("transformers.modeling_outputs")
    except Exception:  # noqa: BLE001 - transformers absent or broken: the caller says what to do
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.load(str(path))
    except Exception:  # noqa: BLE001
        return None


def exported_input_specs(torch: Any, program: Any) -> tuple[TensorSpec, ...]:
    """Names, shapes (symbolic dimension -> None) and dtypes of an ExportedProgram's user inputs."""
    user_inputs = list(program.graph_signature.user_inputs)
    by_name = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    specs = []
    for name in user_inputs:
        value = by_name[name].meta.get("val") if name in by_name else None
        if value is None or not hasattr(value, "shape"):
            raise UsageError(
                f"The ExportedProgram's input {name!r} is not a tensor; only tensor inputs convert."
            )
        shape = tuple(int(d) if isinstance(d, int) else None for d in value.shape)
        dtype = str(value.dtype).replace("torch.", "")
        specs.append(TensorSpec(str(name), shape, dtype))
    return tuple(specs)


def _load_factory(source: str) -> tuple[Callable[[], Any], Any, Path]:
    """``file.py:attr`` or ``pkg.mod:attr`` -> (the callable, its module, a path for the report)."""
    target, _, attr = source.rpartition(":")
    if target.endswith(".py"):
        file = Path(target)
        if not file.is_file():
            raise UsageError(
                f"The factory file {target!r} does not exist.", hint="Pass path/to/file.py:make_model."
            )
        name = f"edgetk_factory_{abs(hash(str(file.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a spec
            raise UsageError(f"Cannot import {target!r} as a Python file.")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise UsageError(
                f"Importing the factory file {target!r} failed: {type(exc).__name__}: {first_line(exc)}",
                hint="Fix the file so that `python -c 'import runpy; runpy.run_path(FILE)'` works.",
            ) from exc
        path = file
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise UsageError(
                f"Cannot import the factory module {target!r}: {type(exc).__name__}: {first_line(exc)}",
                hint="Pass path/to/file.py:make_model, or install the package that holds the module.",
            ) from exc
        path = Path(getattr(module, "__file__", None) or target)
    factory = getattr(module, attr, None)
    if factory is None:
        available = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise UsageError(
            f"{target!r} has no attribute {attr!r}.",
            hint=f"Callables there: {', '.join(available[:12]) or 'none'}." if available else None,
        )
    if not callable(factory):
        raise UsageError(f"{target}:{attr} is not callable; it must be a function returning an nn.Module.")
    return factory, module, path


def _open_factory(torch: Any, source: str, weights: Path | None) -> TorchSource:
    factory, module, path = _load_factory(source)
    try:
        model = factory()
    except Exception as exc:
        raise UsageError(
            f"The factory {source!r} raised {type(exc).__name__}: {first_line(exc)}",
            hint="The factory is called with no arguments and must return a torch.nn.Module.",
        ) from exc
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"The factory {source!r} returned {type(model).__name__}, not a torch.nn.Module.",
            hint="Return the model itself (an nn.Module instance), e.g. `def make_model(): return Net()`.",
        )
    if weights is not None:
        _load_weights(torch, model, weights)
    model.eval()
    names = forward_parameter_names(model)
    specs = _declared_specs(torch, module, model, names)
    return TorchSource(framework="torch_factory", path=path, module=model, inputs=specs)


def _load_weights(torch: Any, model: Any, weights: Path) -> None:
    if not weights.is_file():
        raise UsageError(f"The weights file {str(weights)!r} does not exist.")
    try:
        state = torch.load(str(weights), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UsageError(
            f"{str(weights)!r} is not a state dict that can be loaded safely: {first_line(exc)}",
            hint="Save it with torch.save(model.state_dict(), PATH).",
        ) from exc
    if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(
            f"{str(weights)!r} holds a {type(state).__name__}, not a state dict of tensors.",
            hint="Save it with torch.save(model.state_dict(), PATH).",
        )
    try:
        result = model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = "; ".join(lines[1:4]) if len(lines) > 1 else lines[0] if lines else ""
        raise UsageError(
            f"The weights in {str(weights)!r} do not fit the factory's model: {detail[:600]}",
            hint="Pass the state dict saved from this same architecture (model.state_dict()).",
        ) from exc
    del result


def forward_parameter_names(model: Any) -> list[str]:
    """Positional parameter names of ``model.forward`` (without self); ``input`` when it takes *args."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return ["input"]
    names = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return names or ["input"]


def _declared_specs(torch: Any, module: Any, model: Any, names: list[str]) -> tuple[TensorSpec, ...]:
    """Specs from ``example_inputs()`` or ``model.example_input_shapes``, else unknown-rank placeholders."""
    example = getattr(module, "example_inputs", None)
    if callable(example):
        value = example()
        if isinstance(value, torch.Tensor):
            value = (value,)
        if isinstance(value, Mapping):
            items = [(str(k), v) for k, v in value.items()]
        elif isinstance(value, (tuple, list)):
            if len(value) != len(names):
                raise UsageError(
                    f"example_inputs() returned {len(value)} tensors but forward() takes {len(names)} "
                    f"({', '.join(names)})."
                )
            items = list(zip(names, value))
        else:
            raise UsageError(
                "example_inputs() must return a tensor, a tuple of tensors or a dict name -> tensor."
            )
        return tuple(
            TensorSpec(n, tuple(int(d) for d in t.shape), str(t.dtype).replace("torch.", ""))
            for n, t in items
        )
    declared = getattr(model, "example_input_shapes", None)
    if isinstance(declared, Mapping):
        specs = []
        for name, entry in declared.items():
            if isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[1], str):
                shape, dtype = entry
            else:
                shape, dtype = entry, "float32"
            specs.append(TensorSpec(str(name), tuple(None if d is None else int(d) for d in shape), dtype))
        return tuple(specs)
    return tuple(TensorSpec(name, _UNKNOWN_RANK, "float32") for name in names)
