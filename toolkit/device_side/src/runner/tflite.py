"""TFLite artifacts, whichever of the three TFLite runtimes runs them: the interpreter model, delegates (Edge
TPU), where the nodes ran read from the graph after delegation.
"""
import os
from typing import Any, Callable, Dict, List, Tuple  # noqa: F401
from .base import INSTALL_HINTS, RunnerError, timed_calls
from .measuring import dequantize, in_manifest_order, prepare_input
from .models import Loader, Model, Tensor, XNNPACK, import_numpy, loaders_for, placement_record

# --- shipped from here (the lines above are for the host's type checker) ---

class TFLiteModel(Model):
    """A TFLite artifact in one of the TFLite runtimes' Interpreter (the same API in the three)."""

    format = "tflite"

    def __init__(self, runtime, version, interpreter_cls, path, threads, delegates=None):
        # type: (str, Any, Any, str, int, Any) -> None
        self.runtime = runtime
        self.version = version
        if delegates:
            self.interpreter = interpreter_cls(model_path=path, num_threads=threads,
                                               experimental_delegates=list(delegates))
        else:
            self.interpreter = interpreter_cls(model_path=path, num_threads=threads)
        self.interpreter.allocate_tensors()
        self.inputs = [self.tensor_of(d) for d in self.interpreter.get_input_details()]
        self.outputs = [self.tensor_of(d) for d in self.interpreter.get_output_details()]
        self.extra = {}  # type: dict
        self.delegates = list(delegates or [])

    @staticmethod
    def tensor_of(detail):
        # type: (dict) -> Tensor
        numpy = import_numpy()
        scale, zero = detail.get("quantization", (0.0, 0))
        signature = detail.get("shape_signature")
        return Tensor(detail["name"], [int(d) for d in detail["shape"]], numpy.dtype(detail["dtype"]),
                      float(scale), int(zero), detail["index"],
                      [int(d) for d in signature] if signature is not None else None)

    def dynamic_batch(self):
        # type: () -> bool
        return bool(self.inputs) and all(t.signature and t.signature[0] == -1 for t in self.inputs)

    def resize_batch(self, batch):
        # type: (int) -> None
        """Resize every input's batch dimension (only for a dynamic batch) and re-allocate."""
        for tensor in self.inputs:
            self.interpreter.resize_tensor_input(tensor.key, [batch] + list(tensor.shape[1:]))
        self.interpreter.allocate_tensors()
        self.inputs = [self.tensor_of(d) for d in self.interpreter.get_input_details()]
        self.outputs = [self.tensor_of(d) for d in self.interpreter.get_output_details()]

    def set_inputs(self, pairs):
        # type: (list) -> None
        """``pairs``: [(Tensor, array)] in any order."""
        for tensor, array in pairs:
            self.interpreter.set_tensor(tensor.key, array)

    def invoke(self):
        # type: () -> list
        self.interpreter.invoke()
        return [self.interpreter.get_tensor(t.key) for t in self.outputs]

    def timed_loop(self, runs, min_time):
        # type: (int, float) -> list
        """Only ``invoke()`` is timed (as TFLite's benchmark_model does); the inputs were set once before.

        The outputs are already in the interpreter's buffers when invoke returns; copying them out with
        get_tensor (about 1 us) is left out so that microsecond models are not dominated by the Python API.
        """
        return timed_calls(self.interpreter.invoke, (), runs, min_time)


EDGETPU_LIBRARY = "libedgetpu.so.1"


EDGETPU_CUSTOM_OP = "edgetpu-custom-op"


EDGETPU_HINT = ("Install the Edge TPU runtime and plug in the Coral: add Coral's apt repository "
                "(https://coral.ai/docs/accelerator/get-started/), then `sudo apt-get install libedgetpu1-std`. "
                "The bundle's CPU artifacts are measured without it.")


DELEGATE_NODE = "DELEGATE"  # the op name the interpreter gives a node that a delegate kernel took over


TFLITE_TIMES_NOTE = ("{} {}'s Python interpreter exposes no per-operator timer (TFLite's op profiling lives in the "
                     "C++ benchmark_model tool): reported are each node's operator and whether the delegate took "
                     "it, read from the graph after delegation; times per operator and the time share on the "
                     "delegate are unknown.")


def tflite_delegate_library(record):
    # type: (dict) -> Any
    """The delegate library an artifact needs: the manifest's ``delegate``, or libedgetpu for *_edgetpu.tflite."""
    library = record.get("delegate")
    if isinstance(library, str) and library:
        return library
    if str(record.get("file", "")).endswith("_edgetpu.tflite"):
        return EDGETPU_LIBRARY
    return None


def load_tflite_delegate(loader, version, library):
    # type: (TFLiteLoader, Any, str) -> Any
    """``load_delegate(library)`` of the runtime in use; a missing library or device is ``missing_runtime``."""
    runtime = loader.runtime
    load_delegate = loader.delegate_loader()
    try:
        return load_delegate(library)
    except Exception as exc:  # OSError: no such library; ValueError: the library found no device
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        hint = EDGETPU_HINT if "edgetpu" in library else (
            "Install {} on the device (the delegate's own package), or use an artifact without a delegate."
            .format(library))
        raise RunnerError("missing_runtime", "{} {} could not load the delegate {} ({}).".format(
            runtime, version or "", library, text), hint)


def tflite_nodes(interpreter):
    # type: (Any) -> Any
    """[(index, op, inputs, outputs)] of every node the interpreter holds, or None where the runtime hides them.

    After ``allocate_tensors`` the list holds the model's own nodes first, then one ``DELEGATE`` node per
    partition a delegate took (XNNPACK by default, a loaded delegate such as the Edge TPU's).
    """
    wrapper = getattr(interpreter, "_interpreter", None)
    if wrapper is None or not hasattr(wrapper, "NumNodes"):
        return None
    nodes = []
    for index in range(int(wrapper.NumNodes())):
        nodes.append((index, str(wrapper.NodeName(index)), [int(t) for t in wrapper.NodeInputs(index)],
                      [int(t) for t in wrapper.NodeOutputs(index)]))
    return nodes


def delegated_nodes(nodes):
    # type: (list) -> dict
    """{own node index: delegate node index} for each model node inside a delegate's partition: walk back from
    each DELEGATE node's outputs through the producers until its inputs (the partition's boundary)."""
    producer = {}  # type: dict
    for index, op, _, outs in nodes:
        if op != DELEGATE_NODE:
            for tensor in outs:
                producer[tensor] = index
    by_index = dict((n[0], n) for n in nodes)
    taken = {}  # type: dict
    for index, op, ins, outs in nodes:
        if op != DELEGATE_NODE:
            continue
        boundary = set(ins)
        stack = list(outs)
        seen = set()  # type: set
        while stack:
            tensor = stack.pop()
            if tensor < 0 or tensor in seen or tensor in boundary:
                continue
            seen.add(tensor)
            node = producer.get(tensor)
            if node is None or node in taken:
                continue
            taken[node] = index
            stack.extend(by_index[node][2])
    return taken


def _tensor_name(interpreter, index):
    # type: (Any, int) -> Any
    wrapper = interpreter._interpreter
    for args in ((index, 0), (index,)):
        try:
            return str(wrapper.TensorName(*args))
        except TypeError:
            continue
        except Exception:
            return None
    return None


def tflite_graph_profile(interpreter, intended, runtime, version, top):
    # type: (Any, str, str, Any, int) -> tuple
    """(placement, profile) of a TFLite interpreter from its graph after delegation (no times: see the note)."""
    nodes = tflite_nodes(interpreter)
    note = TFLITE_TIMES_NOTE.format(runtime, version)
    if nodes is None:
        missing = "{} {} does not expose the interpreter's nodes; placement is unknown.".format(runtime, version)
        return (placement_record(intended, None, None, None, [], "none", missing),
                {"available": False, "note": missing, "by_op_type": [], "top_nodes": []})
    own = [n for n in nodes if n[1] != DELEGATE_NODE]
    taken = delegated_nodes(nodes)
    on_ids = set(i for i in taken if intended != "edgetpu" or nodes[i][1] == EDGETPU_CUSTOM_OP)
    executor = {}  # type: dict
    for index, op, _, _ in own:
        if index in on_ids:
            executor[index] = intended
        elif index in taken:
            executor[index] = XNNPACK
        else:
            executor[index] = "cpu"
    fallback = [n for n in own if n[0] not in on_ids]
    if intended == "edgetpu":
        note += (" On the Edge TPU each edgetpu-custom-op node holds every operator the compiler mapped to the "
                 "TPU (edgetpu_compiler.log lists them); the other nodes run on the CPU.")
    placement = placement_record(intended, len(own), len(own) - len(fallback), None,
                                 [n[1] for n in fallback], "graph", note)
    by_type = {}  # type: dict
    for index, op, _, _ in own:
        entry = by_type.setdefault(op, {"op_type": op, "nodes": 0, "time_ms": None, "share": None, "on": {}})
        entry["nodes"] += 1
        entry["on"][executor[index]] = entry["on"].get(executor[index], 0) + 1
    listed = []
    ordered = [n for n in own if executor[n[0]] != intended] + [n for n in own if executor[n[0]] == intended]
    for index, op, _, outs in ordered[:top]:
        listed.append({"name": _tensor_name(interpreter, outs[0]) if outs else None, "op_type": op,
                       "on": executor[index], "time_ms": None, "share": None})
    profile = {
        "available": False,
        "note": note,
        "runs": 0,
        "total_ms": None,
        "overhead": None,
        "by_op_type": sorted(by_type.values(), key=lambda e: (-e["nodes"], e["op_type"])),
        "top_nodes": listed,
    }
    return placement, profile


def tflite_with_tensors(path, threads, forced):
    # type: (str, int, Any) -> Tuple[str, Any]
    """A TFLite interpreter that keeps every intermediate tensor (``experimental_preserve_all_tensors``, which
    also leaves the default delegate out: XNNPACK would fuse the tensors away)."""
    for loader in loaders_for("tflite"):
        if not isinstance(loader, TFLiteLoader) or (forced and loader.runtime != forced):
            continue
        try:
            cls = loader.interpreter_class()
        except ImportError:
            continue
        interpreter = cls(model_path=path, num_threads=threads, experimental_preserve_all_tensors=True)
        interpreter.allocate_tensors()
        return loader.runtime, interpreter
    raise RunnerError("missing_runtime", "No TFLite runtime is installed on this device.",
                      "pip install ai-edge-litert")


class TFLiteLoader(Loader):
    """What the three TFLite runtimes share (their Interpreter and load_delegate are one API): each runtime's
    block says where it imports the two from."""

    def interpreter_class(self):
        # type: () -> Any
        """The runtime's Interpreter class (ImportError when it is not installed)."""
        raise NotImplementedError

    def delegate_loader(self):
        # type: () -> Any
        """The runtime's ``load_delegate`` function."""
        raise NotImplementedError

    def prepare(self, record):
        # type: (Dict[str, Any]) -> Any
        return self.interpreter_class()

    def open(self, prepared, version, path, record, threads, options):
        # type: (Any, Any, str, Dict[str, Any], int, Dict[str, Any]) -> Model
        """A delegate the artifact needs (Edge TPU) comes through the runtime's ``load_delegate``; its load time
        is part of ``load_ms``."""
        library = tflite_delegate_library(record)
        delegates = [load_tflite_delegate(self, version, library)] if library else []
        model = TFLiteModel(self.runtime, version, prepared, path, threads, delegates)
        if library:
            model.extra["delegate"] = library
        return model

    def missing_hint(self, forced):
        # type: (bool) -> str
        if forced:
            return INSTALL_HINTS[self.runtime]
        return "pip install ai-edge-litert (or, on older images, pip install tflite-runtime 'numpy<2')"

    def intended(self, record):
        # type: (Dict[str, Any]) -> str
        library = tflite_delegate_library(record)
        if library is None:
            return XNNPACK
        for place in ("edgetpu", "gpu"):
            if place in library.lower():
                return place
        return os.path.basename(library)

    def placement(self, model, path, record, threads, opts, intended, first, times, top):
        # type: (Any, str, Dict[str, Any], int, Any, str, list, List[float], int) -> Tuple[dict, Any]
        return tflite_graph_profile(model.interpreter, intended, model.runtime, model.version, top)

    def load_options(self, one, warm):
        # type: (Callable[..., Dict[str, Any]], Dict[str, Any]) -> List[Dict[str, Any]]
        return [{"name": "xnnpack_weight_cache", "available": False,
                 "note": "{}'s Interpreter API offers no XNNPACK weight cache (ai-edge-litert's CompiledModel API "
                         "has it).".format(self.runtime)}]

    def layers(self, numpy, bundle, manifest, record, wanted, golden, samples, forced):
        # type: (Any, str, Dict[str, Any], Dict[str, Any], List[str], list, int, Any) -> Tuple[str, Dict[int, list]]
        """The tensors by name from an interpreter that keeps them all (tflite_with_tensors)."""
        values = dict((j, []) for j in range(len(wanted)))  # type: Dict[int, list]
        runtime, interpreter = tflite_with_tensors(os.path.join(bundle, record["file"]), 1, forced)
        details = dict((d["name"], d) for d in interpreter.get_tensor_details())
        inputs = in_manifest_order([TFLiteModel.tensor_of(d) for d in interpreter.get_input_details()],
                                   record.get("inputs"))
        for i in range(samples):
            for t, g in zip(inputs, golden):
                interpreter.set_tensor(t.key, prepare_input(numpy, t, g[i]))
            interpreter.invoke()
            for j, n in enumerate(wanted):
                d = details.get(n)
                if d is None:
                    continue
                try:
                    raw = interpreter.get_tensor(d["index"])
                except ValueError:  # a tensor the runtime did not keep
                    continue
                values[j].append(dequantize(numpy, TFLiteModel.tensor_of(d), raw))
        return runtime, values
