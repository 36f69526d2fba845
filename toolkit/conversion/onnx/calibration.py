"""Calibration for static INT8 on the ONNX route: the feeds onnxruntime's quantizer reads, the pre-processed
model it quantizes (``preprocessed``), and the cache of its measured activation ranges.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from toolkit.conversion.base import BuiltArtifact, ConversionRequest, as_input_dtype
from toolkit.conversion.onnx.checks import transform_problem
from toolkit.conversion.onnx.graph_io import quiet, require_onnx
from toolkit.errors import UsageError, key_line
from toolkit.model.vocabulary import CalibrationMethod


class Reader:
    """onnxruntime's CalibrationDataReader (registered as one) over the request's calibration feeds: the model's
    inputs only, each in the dtype the model declares (int64 token ids stay int64; ORT refuses anything else)."""

    def __init__(self, feeds: Sequence[Mapping[str, np.ndarray]], dtypes: Mapping[str, np.dtype]) -> None:
        self._feeds = feeds
        self._dtypes = dtypes
        self._index = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._index >= len(self._feeds):
            return None
        feed = self._feeds[self._index]
        self._index += 1
        return {name: as_input_dtype(feed[name], dtype) for name, dtype in self._dtypes.items()}

    def rewind(self) -> None:
        self._index = 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        self.rewind()
        while (item := self.get_next()) is not None:
            yield item

    def __len__(self) -> int:
        return len(self._feeds)


def reader(request: ConversionRequest, model_path: Path, limit: int | None = None) -> Reader:
    from onnxruntime.quantization import CalibrationDataReader

    onnx = require_onnx()
    model = onnx.load(str(model_path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    dtypes = {
        vi.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        for vi in model.graph.input
        if vi.name not in initializers
    }
    feeds = request.calibration[:limit] if limit else request.calibration
    missing = [n for n in dtypes if n not in feeds[0]]
    if missing:
        raise UsageError(f"The calibration data has no samples for input(s) {', '.join(missing)}.")

    CalibrationDataReader.register(Reader)  # what ORT's signatures name; it reads through get_next only
    return Reader(feeds, dtypes)


def preprocessed(request: ConversionRequest, base: BuiltArtifact, notes: list[str]) -> Path:
    """``quant_pre_process`` of the base, once per run (every int8 recipe shares it). Symbolic
    shape inference fails on some real models (PP-OCRv4: "Incomplete symbolic shape inference"): retry without
    it, and as a last resort quantize the base as it is."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    target = request.workdir / f"{base.path.stem}.preprocessed.onnx"
    marker = target.with_suffix(".notes")
    if target.is_file() and target.stat().st_mtime >= base.path.stat().st_mtime:
        if marker.is_file():
            notes += [line for line in marker.read_text().splitlines() if line]
        return target
    attempts: list[tuple[str, dict[str, bool]]] = [
        ("", {}),
        ("without symbolic shape inference", {"skip_symbolic_shape": True}),
    ]
    local: list[str] = []
    for label, options in attempts:
        partial = target.with_suffix(".partial.onnx")
        try:
            with quiet():
                quant_pre_process(str(base.path.resolve()), str(partial.resolve()), **options)
            problem = transform_problem(partial, request)
            if problem is not None:
                partial.unlink(missing_ok=True)
                local.append(f"int8 pre-processing {label or 'with symbolic shape inference'} skipped: "
                             f"the model it wrote {problem}")
                continue
            os.replace(partial, target)
            if label:
                local.append(f"int8 pre-processing ran {label}")
            break
        except Exception as exc:  # noqa: BLE001
            partial.unlink(missing_ok=True)
            local.append(
                f"int8 pre-processing {label or 'with symbolic shape inference'} failed: {key_line(exc)}"
            )
    else:
        shutil.copyfile(base.path, target)
        local.append("int8 pre-processing skipped: the base model is quantized as it is")
    marker.write_text("\n".join(local) + "\n")
    notes += local
    return target


def calibration_cache(request: ConversionRequest, source: Path, method: str) -> Path | None:
    """Where ``quantize_static`` keeps this run's activation ranges (ORT's ``calibration_cache_path``), so every static
    INT8 build of the same model, data and method calibrates once; keyed by the model file and a digest of the
    feeds, in the run's scratch directory. MinMax only: the method the profiles use and the one tested with the
    cache (tests/conversion/test_onnx_quant.py)."""
    if method != CalibrationMethod.MINMAX:
        return None
    import hashlib

    digest = hashlib.sha256()
    stat = source.stat()
    digest.update(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    for feed in request.calibration:
        for name in sorted(feed):
            value = np.ascontiguousarray(feed[name])
            digest.update(f"{name}|{value.dtype}|{value.shape}".encode())
            digest.update(value.tobytes())
    return request.workdir / f"{source.stem}.calibration-{method}-{digest.hexdigest()[:16]}.json"

