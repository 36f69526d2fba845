"""The data a conversion run works on: calibration samples, held-out samples, resolved input shapes. Every input
keeps the model's own dtype (``calibration.to_samples``, ``base.as_input_dtype``): an embedding never sees a
float, and the golden data carry what the device will be fed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.conversion import calibration as cal
from toolkit.conversion.input_shapes import resolve_shapes
from toolkit.sources import SourceModel
from toolkit.model.manifest import CalibrationRef, Preprocessing
from toolkit.model.roles import OutputDeclaration

if TYPE_CHECKING:
    from toolkit.model.options import ConvertOptions

MAX_VERIFY_SAMPLES = 500


@dataclass(frozen=True)
class RunData:
    calibration: cal.SampleSet
    heldout: cal.SampleSet
    synthetic: bool  # no data given: verified on random inputs
    shapes: dict[str, tuple[int, ...]]
    calibration_ref: CalibrationRef | None
    preprocessing: Preprocessing | None
    task: str | None = None  # from the eval (else calibration) data's dataset.toml
    outputs: tuple[OutputDeclaration, ...] = ()  # its [outputs.NAME] roles
    anchors: np.ndarray | None = None  # the eval data's SSD anchor table (toolkit.verification.detection)


def prepare_data(options: ConvertOptions, source: SourceModel, progress: Callable[[str], None]) -> RunData:
    """Read the calibration and eval data against the source's inputs; hold some calibration samples out
    for verification when no eval data are given; random inputs (said so) when neither is."""
    cal_file = cal.read_data(Path(options.calibration), source.inputs) if options.calibration else None
    eval_file = cal.read_data(Path(options.eval_data), source.inputs, what="eval data") if options.eval_data else None
    for data_file in (cal_file, eval_file):
        if data_file is not None:
            source.adopt_input_dtypes({name: str(np.asarray(a).dtype) for name, a in data_file.arrays.items()})
    inputs = source.inputs
    unknown_rank = () if getattr(source, "input_shapes_known", True) else [
        s.name for s in inputs if s.shape == (None,)
    ]
    shapes = resolve_shapes(
        inputs, overrides=options.input_shapes, data=cal_file or eval_file, unknown_rank=unknown_rank
    )
    calibration = cal.SampleSet(())
    heldout: cal.SampleSet | None = None
    if cal_file is not None:
        samples = cal.to_samples(cal_file, inputs, shapes)
        if eval_file is None:
            calibration, heldout = cal.split_heldout(samples)
        else:
            calibration = samples
        calibration = cal.subset(calibration, options.calibration_samples)
        cal.warn_if_few(calibration)
    if eval_file is not None:
        heldout = cal.to_samples(eval_file, inputs, shapes, what="eval data")
    synthetic = heldout is None
    if heldout is None:
        heldout = cal.synthetic_samples(inputs, shapes)
        progress("no data given: verifying on random inputs (pass --calibration or --eval-data for real ones)")
    if len(heldout) > MAX_VERIFY_SAMPLES:
        heldout = cal.subset(heldout, MAX_VERIFY_SAMPLES)
    if options.input_values:  # --input-value: every sample fed the value (an If it picks folds: onnx_specialise)
        from toolkit.conversion.onnx.specialise import parse_input_values

        values = parse_input_values(options.input_values, [s.name for s in inputs])
        calibration, heldout = (_fixed(samples, values) for samples in (calibration, heldout))
    return RunData(
        calibration=calibration,
        heldout=heldout,
        synthetic=synthetic,
        shapes=shapes,
        calibration_ref=CalibrationRef(str(options.calibration), cal_file.sha256, len(calibration))
        if cal_file is not None
        else None,
        preprocessing=(cal_file.preprocessing if cal_file else None) or (eval_file.preprocessing if eval_file else None),
        task=(eval_file.task if eval_file else None) or (cal_file.task if cal_file else None),
        outputs=(eval_file.outputs if eval_file else ()) or (cal_file.outputs if cal_file else ()),
        anchors=next((f.anchors for f in (eval_file, cal_file) if f is not None and f.anchors is not None), None),
    )


def _fixed(samples: cal.SampleSet, values: dict[str, float]) -> cal.SampleSet:
    """``samples`` with each input of ``values`` set to its value (in the input's own dtype and shape)."""
    feeds = tuple({name: (np.full_like(np.asarray(array), values[name]) if name in values else array)
                   for name, array in feed.items()} for feed in samples.feeds)
    return cal.SampleSet(feeds, samples.labels)
