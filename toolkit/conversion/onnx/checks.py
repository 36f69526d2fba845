"""Is this ONNX model still the model? ``check_runs`` loads an artifact and runs it once (rejected, or NaN/Inf:
a ConversionError); ``transform_problem`` also compares a float model's outputs with the source's, so a graph
transform that changes what the model computes is caught. ``hint_for`` says what to do about a failure.
``Any``: onnxruntime sessions and their input descriptions (onnxruntime is untyped).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.conversion.base import ConversionRequest
from toolkit.conversion.onnx.graph_io import require_onnx, save_model, session
from toolkit.errors import ArtifactCrashed, ArtifactRefused, ConversionError, key_line, origin
from toolkit.runtimes.execution.onnx import ORT_TYPES

if TYPE_CHECKING:
    import onnx


def hint_for(message: str) -> str:
    """What to do about an onnxruntime or converter failure, from its key line."""
    if "Unrecognized attribute: axis" in message:
        return (
            "The model's opset is too old for per-channel quantization (needs >= 13): allow a newer opset for the "
            "target, or use a recipe with per_channel = false."
        )
    if "symbolic shape" in message.lower() or "shape inference" in message.lower():
        return "Pin every dynamic input dimension with --input-shape NAME=D0,D1,..."
    if "opset" in message.lower() or "version" in message.lower():
        return "Allow a newer ONNX opset for the target (max_opset), or convert from the original framework."
    return "Try another precision (fp32 always works), exclude the failing node with nodes_to_exclude, or run with --debug."


def failure(what: str, exc: BaseException) -> ConversionError:
    """``what`` failed, with the exception's key line, its type and where it was raised (``origin``: the third
    party's module and function), and what to do about it (``hint_for``); the exception stays chained, so
    ``--debug`` prints its traceback."""
    line = key_line(exc)
    where = origin(exc)
    raised = f" ({type(exc).__name__} raised in {where})" if where else ""
    return ConversionError(f"{what}: {line}{raised}", hint=hint_for(line))


def sample_feed(request: ConversionRequest, runner: Any) -> dict[str, np.ndarray]:
    """One calibration sample, or (without calibration data) a deterministic random one of the right shape."""
    sample = request.calibration[0] if request.calibration else {}
    feed: dict[str, np.ndarray] = {}
    for arg in runner.get_inputs():
        if arg.name in sample:
            feed[arg.name] = np.asarray(sample[arg.name]).astype(_dtype(arg))
        else:
            feed[arg.name] = _synthetic(arg, request)
    return feed


def _dtype(arg: Any) -> np.dtype:
    """The numpy dtype of an onnxruntime input (float32 when the type is not a tensor type it names)."""
    return np.dtype(ORT_TYPES.get(arg.type, "float32"))


def _synthetic(arg: Any, request: ConversionRequest) -> np.ndarray:
    shape = request.input_shapes.get(arg.name) or tuple(
        d if isinstance(d, int) and d > 0 else 1 for d in arg.shape
    )
    dtype = _dtype(arg)
    rng = np.random.default_rng(0)
    if np.issubdtype(dtype, np.floating):
        return rng.random(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def check_runs(path: Path, request: ConversionRequest, what: str, *, artifact: bool = False) -> list[np.ndarray]:
    """Load ``path`` in onnxruntime and run it once; a model the runtime rejects is a ConversionError, an
    ArtifactRefused when ``path`` is a finished artifact (its failing node can be kept float and retried)."""
    try:
        runner = session(path)
    except Exception as exc:
        raise _refused(failure(f"onnxruntime cannot load the {what} model", exc), artifact) from exc
    feed = sample_feed(request, runner)
    try:
        outputs = [np.asarray(o) for o in runner.run(None, feed)]
    except Exception as exc:
        raise _refused(failure(f"The {what} model fails to run in onnxruntime", exc), artifact) from exc
    for arg, out in zip(runner.get_outputs(), outputs):
        if np.issubdtype(out.dtype, np.floating) and not np.all(np.isfinite(out)):
            raise ConversionError(
                f"The {what} model gives NaN/Inf in output {arg.name!r} on a calibration sample.",
                hint="This precision cannot represent the model's values; use fp32 or int8 for it.",
            )
    return outputs


def first_run_in_child(path: Path, request: ConversionRequest, what: str) -> None:
    """Run the artifact at ``path`` once in a child process (``crash_guard``) before this process loads it: a
    crash of onnxruntime is an ArtifactCrashed naming the node it sits in, not the end of the convert run."""
    from types import SimpleNamespace

    from toolkit.conversion import crash_guard
    from toolkit.conversion.backend import backend_for
    from toolkit.model.vocabulary import Format
    from toolkit.runtimes.inspection.onnx import load_onnx

    onnx = require_onnx()
    graph = load_onnx(path, load_external_data=False).graph
    weights = {tensor.name for tensor in graph.initializer}
    args = [SimpleNamespace(  # what sample_feed reads of an onnxruntime input
        name=value.name, type=f"tensor({onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type).lower()})",
        shape=[d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim])
        for value in graph.input if value.name not in weights]
    feed = sample_feed(request, SimpleNamespace(get_inputs=lambda: args))
    crash = crash_guard.first_run(path, feed, backend=backend_for(request.source.framework, Format.ONNX), threads=None,
                                  scratch=request.workdir)
    if crash is not None:
        raise ArtifactCrashed(crash.reason(what))


def _refused(error: ConversionError, artifact: bool) -> ConversionError:
    return ArtifactRefused(error.message, hint=error.hint) if artifact else error


def transform_problem(path: Path, request: ConversionRequest) -> str | None:
    """Why the float model at ``path`` no longer is the source model (does not load, does not run, or computes other
    outputs on a calibration sample); None when it is. Transforms can break models with control flow."""
    try:
        runner = session(path)
    except Exception as exc:  # noqa: BLE001
        return f"does not load in onnxruntime ({key_line(exc)})"
    feed = sample_feed(request, runner)
    try:
        got = [np.asarray(o) for o in runner.run(None, feed)]
    except Exception as exc:  # noqa: BLE001
        return f"does not run in onnxruntime ({key_line(exc)})"
    try:
        want = [np.asarray(o) for o in request.source.predict(feed)]
    except Exception:  # noqa: BLE001 - the feed is the model's; a source that names inputs otherwise is not judged
        return None
    if len(want) != len(got):
        return f"has {len(got)} outputs instead of {len(want)}"
    for index, (w, g) in enumerate(zip(want, got)):
        if w.shape != g.shape:
            return f"gives output {index} the shape {g.shape} instead of {w.shape}"
        if not np.issubdtype(w.dtype, np.number):
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        error = float(np.max(np.abs(w64 - g64))) if w.size else 0.0
        scale = max(1.0, float(np.max(np.abs(w64))) if w.size else 1.0)
        if not np.all(np.isfinite(g64)) or error > 1e-3 * scale:
            return f"computes other values in output {index} (max error {error:.3g})"
    return None


def model_problem(model: onnx.ModelProto, request: ConversionRequest) -> str | None:
    """``transform_problem`` of a model in memory (saved in the workdir for the check)."""
    path = request.workdir / "transform-check.onnx"
    request.workdir.mkdir(parents=True, exist_ok=True)
    try:
        save_model(model, path, final_name=path.name)
        return transform_problem(path, request)
    finally:
        path.unlink(missing_ok=True)
