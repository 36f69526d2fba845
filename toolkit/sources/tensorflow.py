"""Keras 3 files (.keras, .h5) and SavedModel directories behind the ``SourceModel`` interface.

Besides reference predictions, each source can give the conversion routes one thing they all need: a
``tf.function`` with the input shapes fixed (``serving_function``) and a SavedModel written from it
(``export_saved_model``). Both name the outputs after the source's outputs, so every artifact built from it
(TFLite signature, ONNX graph) carries the same input and output names the pipeline feeds and compares by.
Exporting through a SavedModel (``keras.export.ExportArchive`` / ``tf.saved_model.save``) is the route that
freezes the variables correctly with Keras 3; ``from_concrete_functions`` on a live model gives NaN models
(findings.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from toolkit.compat import keras as keras_compat
from toolkit.errors import MissingDependency, UsageError, key_line
from toolkit.model.tensors import TensorSpec
from toolkit.model.vocabulary import Framework
from toolkit.sources.base import SourceModel

Shapes = Mapping[str, Sequence[int | None]]


def _tf() -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise MissingDependency(
            "tensorflow", extra="tf", purpose="Loading a Keras or SavedModel source"
        ) from exc
    return tf


def _keras() -> ModuleType:
    _tf()
    try:
        import keras
    except ImportError as exc:
        raise MissingDependency("keras", extra="tf", purpose="Loading a Keras model") from exc
    return keras


def _dtype_name(dtype: Any) -> str:  # Any: a tf.DType
    name = getattr(dtype, "name", None) or str(dtype)
    return str(np.dtype(name).name) if name not in ("string", "resource", "variant") else str(name)


def _spec_shape(shape: Any) -> tuple[int | None, ...]:  # Any: a tf.TensorShape
    dims = shape.as_list() if hasattr(shape, "as_list") else list(shape)
    return tuple(None if d is None or int(d) < 0 else int(d) for d in dims)


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    result = []
    for name in names:
        clean = re.sub(r"[^A-Za-z0-9_.\-]", "_", name) or "output"
        if clean in seen:
            seen[clean] += 1
            clean = f"{clean}_{seen[clean]}"
        else:
            seen[clean] = 0
        result.append(clean)
    return result


def open_tensorflow(path: Path, framework: Framework) -> SourceModel:
    """Load a Keras file (``Framework.KERAS``) or a SavedModel directory (``Framework.SAVEDMODEL``)."""
    path = Path(path)
    if framework == Framework.KERAS:
        return KerasSource(path)
    if framework == Framework.SAVEDMODEL:
        return SavedModelSource(path)
    raise UsageError(f"Unknown TensorFlow framework {framework!r}.", hint="Use 'keras' or 'savedmodel'.")


class TensorFlowSource(SourceModel):
    """What Keras and SavedModel sources share: named I/O, a fixed-shape serving function, an export."""

    def _call(self, args: Sequence[Any]) -> Sequence[Any]:  # Any: tf tensors
        """Run the model on tensors in ``inputs`` order; outputs in ``outputs`` order."""
        raise NotImplementedError

    def predict(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        tf = _tf()
        missing = [s.name for s in self._inputs if s.name not in feeds]
        if missing:
            raise UsageError(
                f"No data for input(s) {', '.join(missing)} of {self.path.name}.",
                hint=f"Feed every input: {', '.join(s.name for s in self._inputs)}.",
            )
        args = [tf.convert_to_tensor(np.asarray(feeds[s.name]), dtype=s.dtype) for s in self._inputs]
        outputs = self._call(args)
        return [np.asarray(o.numpy() if hasattr(o, "numpy") else o, dtype=np.float32) for o in outputs]

    def input_signature(self, shapes: Shapes | None = None) -> list[Any]:  # Any: tf.TensorSpec
        """``tf.TensorSpec`` per input, named as the input, with ``shapes`` pinned (None stays dynamic)."""
        tf = _tf()
        specs = []
        for spec in self._inputs:
            shape = tuple(shapes[spec.name]) if shapes and spec.name in shapes else spec.shape
            if len(shape) != len(spec.shape):
                raise UsageError(
                    f"Input {spec.name!r} has rank {len(spec.shape)}, but the shape {tuple(shape)} has "
                    f"rank {len(shape)}.",
                    hint=f"Give --input-shape {spec.name}=... with {len(spec.shape)} dimensions.",
                )
            specs.append(tf.TensorSpec(shape, tf.as_dtype(spec.dtype), name=spec.name))
        return specs

    def _serve(self) -> Callable[..., dict[str, object]]:
        """The model taking the inputs positionally and returning {output name: tensor}."""
        names = [s.name for s in self._outputs]

        def serve(*args: Any) -> dict[str, object]:  # Any: tf tensors
            return dict(zip(names, self._call(list(args))))

        return serve

    def serving_function(self, shapes: Shapes | None = None) -> Any:  # Any: a tf.function
        """A ``tf.function`` of ``_serve`` with the inputs' shapes fixed."""
        return _tf().function(self._serve(), input_signature=self.input_signature(shapes), autograph=False)

    def _write_saved_model(self, directory: Path, shapes: Shapes | None) -> None:
        raise NotImplementedError

    def export_saved_model(self, directory: Path, shapes: Shapes | None = None) -> Path:
        """Write a SavedModel whose ``serving_default`` has ``shapes`` pinned and the source's I/O names."""
        directory = Path(directory)
        try:
            self._write_saved_model(directory, shapes)
        except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
            from toolkit.errors import ConversionError

            raise ConversionError(
                f"Could not export {self.path.name} as a SavedModel: {key_line(exc)}",
                hint="Check that the model runs on inputs of the requested shapes.",
            ) from None
        return directory


class KerasSource(TensorFlowSource):
    """A Keras 3 model file (.keras zip or legacy .h5)."""

    framework = Framework.KERAS

    def __init__(self, path: Path) -> None:
        self.path = path
        keras = _keras()
        if not path.is_file():
            raise UsageError(f"The Keras file {path} does not exist.", hint="Pass a .keras or .h5 file.")
        try:
            model = keras.saving.load_model(str(path), compile=False)
        except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
            raise UsageError(
                f"Cannot load the Keras model {path.name}: {key_line(exc)}",
                hint="The file may be truncated or corrupt, or saved by an incompatible Keras; save it again "
                "with model.save('model.keras').",
            ) from None
        tensors = list(getattr(model, "inputs", None) or [])
        if not tensors:
            raise UsageError(
                f"The Keras model {path.name} has no defined inputs (a subclassed model that was never built).",
                hint="Save a Functional or Sequential model, or export it with model.export(DIR) and pass DIR.",
            )
        self.model = model
        self._structure = keras_compat.inputs_structure(model)
        self._inputs = tuple(
            TensorSpec(name=str(t.name), shape=_spec_shape(t.shape), dtype=_dtype_name(t.dtype))
            for t in tensors
        )
        outs = list(model.outputs or [])
        op_names = []
        for t in outs:
            op_names.append(keras_compat.producing_layer_name_or(t, str(t.name)))
        self._outputs = tuple(
            TensorSpec(name=n, shape=_spec_shape(t.shape), dtype=_dtype_name(t.dtype))
            for n, t in zip(_unique(op_names), outs)
        )

    def _pack(self, args: Sequence[Any]) -> Any:  # Any: tf tensors
        if len(args) == 1 and (
            self._structure is None or not isinstance(self._structure, (list, tuple, dict))
        ):
            return args[0]
        keras = _keras()
        if self._structure is None:
            return list(args)
        by_name = {s.name: a for s, a in zip(self._inputs, args)}
        flat_names = [str(t.name) for t in keras.tree.flatten(self._structure)]
        return keras.tree.pack_sequence_as(self._structure, [by_name[n] for n in flat_names])

    def _call(self, args: Sequence[Any]) -> Sequence[Any]:  # Any: tf tensors
        keras = _keras()
        result = self.model(self._pack(args), training=False)
        return list(keras.tree.flatten(result))

    def _write_saved_model(self, directory: Path, shapes: Shapes | None) -> None:
        # ExportArchive tracks the Keras 3 variables so the SavedModel carries their values; a plain
        # tf.Module holding the model does not, and its TFLite conversion reads uninitialised variables (NaN).
        archive = _keras().export.ExportArchive()
        archive.track(self.model)
        archive.add_endpoint("serve", self._serve(), input_signature=self.input_signature(shapes))
        archive.write_out(str(directory), verbose=False)


class SavedModelSource(TensorFlowSource):
    """A SavedModel directory, called through its serving signature."""

    framework = Framework.SAVEDMODEL

    def __init__(self, path: Path) -> None:
        self.path = path
        tf = _tf()
        if not path.is_dir() or not (
            (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file()
        ):
            raise UsageError(
                f"The directory {path} is not a SavedModel (no saved_model.pb inside).",
                hint="Pass the directory written by model.export() or tf.saved_model.save().",
            )
        try:
            loaded = tf.saved_model.load(str(path))
        except Exception as exc:  # noqa: BLE001 (frameworks raise any type; reported as one plain line)
            # Restore-only objects (a v1 optimizer's slot variables: "'_UserObject' object has no attribute
            # 'add_slot'") break the object-graph loader, not the serving graph: read the signatures the way
            # the TFLite converter does (the v1 loader in a session), frozen.
            loaded = _frozen_signatures(tf, path, exc)
        signatures = dict(getattr(loaded, "signatures", {}) or {})
        if "serving_default" in signatures:
            key = "serving_default"
        elif len(signatures) == 1:
            key = next(iter(signatures))
        else:
            raise UsageError(
                f"The SavedModel {path} has no serving_default signature"
                + (f" (it has: {', '.join(sorted(signatures))})." if signatures else " (it has none)."),
                hint="Export it with a serving signature: model.export(DIR) or "
                "tf.saved_model.save(obj, DIR, signatures=...).",
            )
        self.signature_key = key
        self._loaded = loaded
        self._fn = signatures[key]
        _, kwargs = self._fn.structured_input_signature
        self._inputs = tuple(
            TensorSpec(name=name, shape=_spec_shape(spec.shape), dtype=_dtype_name(spec.dtype))
            for name, spec in kwargs.items()
        )
        outputs = self._fn.structured_outputs
        if not isinstance(outputs, Mapping):
            raise UsageError(f"The SavedModel {path} signature {key!r} does not return named outputs.")
        self._output_keys = sorted(outputs)
        self._outputs = tuple(
            TensorSpec(
                name=name, shape=_spec_shape(outputs[name].shape), dtype=_dtype_name(outputs[name].dtype)
            )
            for name in self._output_keys
        )

    def _call(self, args: Sequence[Any]) -> Sequence[Any]:  # Any: tf tensors
        result = self._fn(**{s.name: a for s, a in zip(self._inputs, args)})
        return [result[k] for k in self._output_keys]

    def _write_saved_model(self, directory: Path, shapes: Shapes | None) -> None:
        tf = _tf()
        module = tf.Module()
        if not isinstance(self._loaded, _FrozenModel):  # frozen: constants, nothing to track
            module.loaded = self._loaded  # tracked, so its variables are saved with their values
        module.serve = self.serving_function(shapes)
        tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})


class _FrozenSignature:
    """One serving signature read by the v1 loader with its variables folded into constants: called with
    keyword tensors like a loaded signature, with the same ``structured_*`` description (Any: tf objects)."""

    def __init__(self, function: Any, inputs: Mapping[str, object], outputs: Mapping[str, object]) -> None:
        self._function = function
        self.structured_input_signature = ((), dict(inputs))
        self.structured_outputs = dict(outputs)

    def __call__(self, **kwargs: Any) -> dict[str, object]:  # Any: tf tensors
        return dict(self._function(*[kwargs[name] for name in self.structured_input_signature[1]]))


def _frozen_signatures(tf: ModuleType, path: Path, error: BaseException) -> Any:  # Any: tf objects
    """A stand-in for ``tf.saved_model.load(path)`` when the object graph cannot be revived (``error``): a
    variable-free module whose ``signatures`` are the serving signatures, loaded by the v1 loader (what
    ``tf.compat.v1.lite.TFLiteConverter.from_saved_model`` does) and frozen. Refuses with ``error``'s line
    when that fails too."""
    try:
        graph = tf.Graph()
        signatures: dict[str, _FrozenSignature] = {}
        with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
            meta = tf.compat.v1.saved_model.loader.load(session, [tf.saved_model.SERVING], str(path))
            defs = {k: v for k, v in meta.signature_def.items() if not k.startswith("__")}
            fetches = sorted({t.name.split(":")[0] for d in defs.values() for t in d.outputs.values()})
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), fetches)
        wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(frozen, name=""), [])
        for key, sig in defs.items():
            tensor = wrapped.graph.get_tensor_by_name
            function = wrapped.prune([tensor(t.name) for t in sig.inputs.values()],
                                     {name: tensor(t.name) for name, t in sig.outputs.items()})
            specs = {name: tf.TensorSpec(tf.TensorShape(t.tensor_shape), tf.as_dtype(t.dtype), name=name)
                     for name, t in sig.inputs.items()}
            outs = {name: tf.TensorSpec(tf.TensorShape(t.tensor_shape), tf.as_dtype(t.dtype))
                    for name, t in sig.outputs.items()}
            signatures[key] = _FrozenSignature(function, specs, outs)
    except Exception:  # noqa: BLE001 - the v1 loader fails too: the directory itself is the problem
        raise UsageError(
            f"Cannot load the SavedModel {path}: {key_line(error)}",
            hint="The directory may be incomplete or corrupt (saved_model.pb, variables/); export it again.",
        ) from None
    return _FrozenModel(signatures)


class _FrozenModel:
    """What ``_frozen_signatures`` loads: signatures only, no variables to track when exporting."""

    def __init__(self, signatures: Mapping[str, _FrozenSignature]) -> None:
        self.signatures = dict(signatures)


__all__ = ["KerasSource", "SavedModelSource", "TensorFlowSource", "open_tensorflow"]
