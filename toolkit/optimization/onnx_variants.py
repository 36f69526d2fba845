"""The ONNX variants whose cold load ``load_time`` measures against the plain artifact: onnxruntime's offline
graph optimizations (``basic``/``extended``, ONNX or ORT format) and weights in one external data file."""

from __future__ import annotations

import os
from pathlib import Path

from toolkit.errors import UsageError

LEVELS = ("basic", "extended")  # not "all": its layout transforms are for the CPU that runs it, not the device


def optimize_onnx(source: str | os.PathLike[str], out: str | os.PathLike[str], *, level: str = "extended",
                  ort_format: bool = False) -> Path:
    """Apply onnxruntime's graph optimizations at ``level`` (basic or extended) offline and save the result to
    ``out`` (ONNX protobuf, or the ORT flatbuffer format with ``ort_format``). Written to a partial file and
    renamed, so a failure leaves nothing behind."""
    import onnxruntime as ort

    if level not in LEVELS:
        hint = ("'all' adds layout transforms for the CPU that runs it (not portable to the device); "
                "use basic or extended." if level == "all" else "Pick basic or extended.")
        raise UsageError(f"Unknown offline graph optimization level {level!r}.", hint=hint)
    source, target = Path(source), Path(out)
    if not source.is_file():
        raise UsageError(f"The model {str(source)!r} does not exist.")
    partial = target.with_name(f".{target.name}.partial{target.suffix}")
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if level == "basic"
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    options.optimized_model_filepath = str(partial)
    options.log_severity_level = 3
    if ort_format:
        options.add_session_config_entry("session.save_model_format", "ORT")
    try:
        ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
        partial.replace(target)
    finally:
        if partial.exists():
            partial.unlink()
    return target


def to_external_data(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write ``source`` with every initializer in one external data file next to ``out`` (``<out>.data``)."""
    import onnx

    model = onnx.load(str(source))
    target = Path(out)
    data_name = target.name + ".data"
    if (target.parent / data_name).exists():
        (target.parent / data_name).unlink()
    onnx.save_model(model, str(target), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_name, size_threshold=1024)
    return target
