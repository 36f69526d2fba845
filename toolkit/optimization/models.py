"""Load a SOURCE for optimization, save it back in its own framework and format, and run it.

Only Keras 3 files and PyTorch models (TorchScript, ExportedProgram, a ``file.py:make_model`` factory) can be
optimized: the techniques change weights and layers, which needs the framework the model was written in.
Factories are written out as TorchScript (traced with one sample of the training or eval data, scripted when
there is none), since a factory's Python code cannot be written back.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any  # Any: Keras/PyTorch objects (untyped frameworks, imported lazily)

import numpy as np

from toolkit.errors import UsageError
from toolkit.model.vocabulary import Framework
from toolkit.sources.detect import detect_framework

if TYPE_CHECKING:  # pragma: no cover
    from torch.export import ExportedProgram


class OptimizableModel:
    """A model being optimized: its framework object plus what is needed to save it in the source's format.

    ``kind`` is Framework.KERAS, TORCHSCRIPT, EXPORTED_PROGRAM or TORCH_FACTORY. Techniques replace ``model`` (Keras
    rebuilds) or change it in place (PyTorch module surgery).
    """

    def __init__(self, *, kind: Framework, model: Any, source: str, example: tuple[np.ndarray, ...] | None = None,
                 input_names: Sequence[str] = ()) -> None:
        self.kind = kind
        self.model = model
        self.source = source
        self.example = example
        self.input_names = tuple(input_names)
        self.dynamic_batch = False  # an ExportedProgram exported with a symbolic batch dimension

    @property
    def framework(self) -> str:
        return "keras" if self.kind == Framework.KERAS else "torch"

    @property
    def is_torch_module_code(self) -> bool:
        """True when the PyTorch model is plain Python modules (a factory), so its layers can be replaced."""
        return self.kind == Framework.TORCH_FACTORY


def load(source: str) -> OptimizableModel:
    """Open ``source`` (Keras 3 file or a PyTorch model); anything else is a UsageError naming the choices."""
    kind = Framework(detect_framework(source))
    if kind == Framework.KERAS:
        if not source.endswith(".keras"):
            raise UsageError(f"{source!r} is a legacy HDF5 Keras file; optimize writes Keras 3 '.keras' files.",
                             hint="Re-save it with model.save('model.keras') and pass that file.")
        import keras

        model = keras.saving.load_model(source, compile=False)
        return OptimizableModel(kind=Framework.KERAS, model=model, source=source,
                                input_names=[_keras_input_name(t) for t in model.inputs])
    if kind not in (Framework.TORCHSCRIPT, Framework.EXPORTED_PROGRAM, Framework.TORCH_FACTORY):
        raise UsageError(
            f"Cannot optimize {source!r}: it is a {kind} model, and optimize works on the framework a model was "
            "trained in.",
            hint="Pass a Keras 3 .keras file, a TorchScript or ExportedProgram (.pt2) file, or a factory "
            "path/to/file.py:make_model.",
        )
    import torch

    if kind == Framework.TORCHSCRIPT:
        # torch.jit's functions are untyped (the ignore is needed under --strict only)
        module = torch.jit.load(source, map_location="cpu")  # type: ignore[no-untyped-call, unused-ignore]
        return OptimizableModel(kind=kind, model=module, source=source, input_names=["x"])
    if kind == Framework.EXPORTED_PROGRAM:
        program = torch.export.load(source)
        example, dynamic = _exported_example(program)
        loaded = OptimizableModel(kind=kind, model=program.module(), source=source, example=example,
                                  input_names=[f"x{i}" if i else "x" for i in range(len(example))])
        loaded.dynamic_batch = dynamic
        return loaded
    module = _load_factory(source)
    return OptimizableModel(kind=kind, model=module, source=source, input_names=["x"])


def _keras_input_name(tensor: Any) -> str:
    name = str(getattr(tensor, "name", "x"))
    return name.split(":")[0]


def _exported_example(program: ExportedProgram) -> tuple[tuple[np.ndarray, ...], bool]:
    """Zeros shaped like the ExportedProgram's user inputs (from the placeholders' recorded values), and
    whether the batch dimension is symbolic (then the example has batch 1)."""
    user_inputs = set(program.graph_signature.user_inputs)
    arrays = []
    dynamic = False
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            value = node.meta.get("val")
            shape = []
            for index, dim in enumerate(value.shape):
                if isinstance(dim, int):
                    shape.append(dim)
                else:
                    dynamic = dynamic or index == 0
                    shape.append(1)
            arrays.append(np.zeros(shape, dtype=np.float32))
    return tuple(arrays), dynamic


def _load_factory(source: str) -> Any:
    import torch

    target, _, attribute = source.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise UsageError(f"The factory file {target!r} does not exist.",
                                 hint="Pass path/to/file.py:make_model with a file that exists.")
            name = f"_edgetk_factory_{abs(hash(path.resolve()))}"
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ImportError as exc:
        raise UsageError(f"Cannot import the factory module {target!r}: {exc}.",
                         hint="Check the path and that its imports are installed.") from exc
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise UsageError(f"{target!r} has no function {attribute!r}.",
                         hint="Pass path/to/file.py:make_model naming a function that returns a torch.nn.Module.")
    model = factory()
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{source} returned a {type(model).__name__}, not a torch.nn.Module.",
                         hint="Make the factory return the model (an nn.Module).")
    return model.eval()


def check_output_path(model: OptimizableModel, out: Path) -> None:
    """The output suffix must be one ``convert`` recognises as the source's format."""
    suffix = out.suffix.lower()
    if model.kind == Framework.KERAS and suffix != ".keras":
        raise UsageError(f"--out {str(out)!r}: a Keras model is written as a '.keras' file.",
                         hint="Pass --out NAME.keras.")
    if model.kind == Framework.EXPORTED_PROGRAM and suffix != ".pt2":
        raise UsageError(f"--out {str(out)!r}: an ExportedProgram is written as a '.pt2' file.",
                         hint="Pass --out NAME.pt2.")
    torchscript = model.kind in (Framework.TORCHSCRIPT, Framework.TORCH_FACTORY)
    if torchscript and suffix not in (".pt", ".jit", ".pth", ".torchscript"):
        raise UsageError(f"--out {str(out)!r}: a PyTorch model is written as TorchScript ('.pt').",
                         hint="Pass --out NAME.pt.")


def example_inputs(model: OptimizableModel, data: tuple[np.ndarray, ...] | None) -> tuple[np.ndarray, ...] | None:
    """One sample to trace, export or time the model with: from the data, else what the model records."""
    if data is not None:
        return tuple(a[:1] for a in data)
    if model.example is not None:
        return model.example
    if model.kind == Framework.KERAS:
        shapes = [tuple(1 if d is None else int(d) for d in t.shape) for t in model.model.inputs]
        return tuple(np.zeros(s, dtype=np.float32) for s in shapes)
    return None


def save(model: OptimizableModel, path: Path) -> None:
    """Write the model in the source's own format (see the module docstring for factories)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if model.kind == Framework.KERAS:
        model.model.save(path)
        return
    import torch

    module = model.model
    if model.kind == Framework.EXPORTED_PROGRAM:
        assert model.example is not None
        args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in model.example)
        dynamic = None
        if model.dynamic_batch:
            batch = torch.export.Dim("batch")
            dynamic = tuple({0: batch} for _ in args)
            args = tuple(torch.cat([a, a]) if a.shape[0] == 1 else a for a in args)  # 1 would specialize
        program = torch.export.export(module, args, dynamic_shapes=dynamic)
        torch.export.save(program, str(path))
        return
    if isinstance(module, torch.jit.ScriptModule):
        torch.jit.save(module, str(path))
        return
    module.eval()
    if model.example is not None:
        args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in model.example)
        with torch.no_grad():
            example = args if len(args) > 1 else args[0]
            scripted = torch.jit.trace(module, example)  # type: ignore[no-untyped-call, unused-ignore]
    else:
        try:
            scripted = torch.jit.script(module)
        except Exception as exc:  # torch raises many types from the scripting compiler
            raise UsageError(
                "Cannot write the factory's model as TorchScript: torch.jit.script failed and there is no data "
                f"to trace it with ({type(exc).__name__}).",
                hint="Pass --train-data or --eval-data so the model can be traced with one sample.",
            ) from exc
    torch.jit.save(scripted, str(path))


def predict(model: OptimizableModel, inputs: tuple[np.ndarray, ...], *, batch_size: int = 256) -> np.ndarray:
    """First output of the model for all samples, as float32 numpy."""
    chunks = []
    count = inputs[0].shape[0]
    if model.kind == Framework.KERAS:
        for start in range(0, count, batch_size):
            batch = [a[start:start + batch_size] for a in inputs]
            out = model.model(batch if len(batch) > 1 else batch[0], training=False)
            out = out[0] if isinstance(out, (list, tuple)) else out
            chunks.append(np.asarray(out, dtype=np.float32))
        return np.concatenate(chunks)
    import torch

    module = model.model
    if model.kind == Framework.EXPORTED_PROGRAM and not model.dynamic_batch:
        # An ExportedProgram's module checks the batch size it was exported with: run in chunks of that size.
        assert model.example is not None
        batch_size = int(model.example[0].shape[0])
    elif model.kind != Framework.EXPORTED_PROGRAM:
        module.eval()  # an ExportedProgram's module refuses eval()/train(); it has no mode to set
    with torch.no_grad():
        for start in range(0, count, batch_size):
            arrays = [a[start:start + batch_size] for a in inputs]
            real = arrays[0].shape[0]
            if model.kind == Framework.EXPORTED_PROGRAM and not model.dynamic_batch and real < batch_size:
                arrays = [np.concatenate([a, np.zeros((batch_size - real, *a.shape[1:]), a.dtype)]) for a in arrays]
            out = module(*[torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
            out = out[0] if isinstance(out, (list, tuple)) else out
            chunks.append(out.float().numpy()[:real])
    return np.concatenate(chunks)
