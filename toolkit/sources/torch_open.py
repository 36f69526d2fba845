"""Open a PyTorch source and read its inputs where the model records them (the forms and rules:
``toolkit.sources.torch``)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolkit.errors import UsageError, key_line
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import Framework
from toolkit.sources.torch import UNKNOWN_RANK, TorchSource, import_torch

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn
    from torch.export import ExportedProgram


def open_torch(source: str, framework: str, *, weights: Path | None) -> TorchSource:
    """Load a TorchScript file, an ExportedProgram file or a factory's eager module."""
    torch = import_torch()
    if weights is not None and framework != Framework.TORCH_FACTORY:
        raise UsageError(
            f"--weights applies to a factory source (file.py:make_model), not to a {framework} file: the weights "
            "are already inside it.",
            hint="Drop --weights, or pass the factory that builds the module.",
        )
    if framework == Framework.TORCHSCRIPT:
        return _open_torchscript(torch, Path(source))
    if framework == Framework.EXPORTED_PROGRAM:
        return _open_exported_program(torch, Path(source))
    if framework == Framework.TORCH_FACTORY:
        return _open_factory(torch, source, weights)
    raise UsageError(f"{source!r} is not a PyTorch model ({framework}).")


def _open_torchscript(torch: ModuleType, path: Path) -> TorchSource:
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        raise UsageError(
            f"{str(path)!r} is not a TorchScript model: {key_line(exc)}",
            hint="Save it with torch.jit.save(torch.jit.script(model) or torch.jit.trace(model, x), PATH), or "
            "pass a factory path/to/file.py:make_model with --weights FILE.",
        ) from exc
    module.eval()
    try:
        arguments = module.forward.schema.arguments[1:]
        names = [arg.name for arg in arguments]
    except Exception:  # noqa: BLE001  # pragma: no cover - every ScriptModule has a forward schema
        names = ["input"]
    specs = tuple(TensorSpec(name, UNKNOWN_RANK, "float32") for name in names)
    return TorchSource(framework=Framework.TORCHSCRIPT, path=path, module=module, inputs=specs)


def _open_exported_program(torch: ModuleType, path: Path) -> TorchSource:
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
                f"{str(path)!r} could not be loaded as an ExportedProgram: {key_line(exc)}",
                hint="If the model returns a Hugging Face ModelOutput (a dataclass), install transformers (it "
                "registers those output types, then the file loads) or export a wrapper whose forward returns "
                "`model(...).to_tuple()` (tensors or a tuple). Otherwise save it with "
                "torch.export.save(torch.export.export(model, args), 'model.pt2').",
            ) from exc
    specs = exported_input_specs(torch, program)
    return TorchSource(
        framework=Framework.EXPORTED_PROGRAM,
        path=path,
        module=program.module(),
        inputs=specs,
        exported_program=program,
    )


def _load_with_transformers_outputs(torch: ModuleType, path: Path) -> ExportedProgram | None:
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


def exported_input_specs(torch: ModuleType, program: ExportedProgram) -> tuple[TensorSpec, ...]:
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


def load_factory(source: str) -> tuple[Callable[[], Any], ModuleType, Path]:  # Any: what the user's factory returns
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
                f"Importing the factory file {target!r} failed: {type(exc).__name__}: {key_line(exc)}",
                hint="Fix the file so that `python -c 'import runpy; runpy.run_path(FILE)'` works.",
            ) from exc
        path = file
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise UsageError(
                f"Cannot import the factory module {target!r}: {type(exc).__name__}: {key_line(exc)}",
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


def _open_factory(torch: ModuleType, source: str, weights: Path | None) -> TorchSource:
    factory, module, path = load_factory(source)
    try:
        model = factory()
    except Exception as exc:
        raise UsageError(
            f"The factory {source!r} raised {type(exc).__name__}: {key_line(exc)}",
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
    return TorchSource(framework=Framework.TORCH_FACTORY, path=path, module=model, inputs=specs)


def _load_weights(torch: ModuleType, model: nn.Module, weights: Path) -> None:
    if not weights.is_file():
        raise UsageError(f"The weights file {str(weights)!r} does not exist.")
    try:
        state = torch.load(str(weights), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UsageError(
            f"{str(weights)!r} is not a state dict that can be loaded safely: {key_line(exc)}",
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


def forward_parameter_names(model: nn.Module) -> list[str]:
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


def _declared_specs(
    torch: ModuleType, module: ModuleType, model: nn.Module, names: list[str]
) -> tuple[TensorSpec, ...]:
    """Specs from ``example_inputs()`` or ``model.example_input_shapes``, else unknown rank."""
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
    return tuple(TensorSpec(name, UNKNOWN_RANK, "float32") for name in names)
