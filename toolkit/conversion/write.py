"""Writing a bundle: the kept artifacts, their golden outputs, the runner and ``manifest.json``.

Per format one artifact is marked preferred (:func:`preferred`; host latency counts only on a profile that is
this host: ``host_timing``); the device measures every verified artifact and selects (toolkit.checks.selection).
Golden inputs are the first held-out samples in the model's own dtype; golden outputs are what each artifact
gave on this host, with the drift a device may show.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.delivery import on_demand
from toolkit.verification import verify
from toolkit.__about__ import __version__
from toolkit.delivery.bundle import GOLDEN_INPUTS, GOLDEN_REFERENCE, golden_outputs_name, install_runner, save_npz, write_manifest
from toolkit.conversion.cache import source_hash
from toolkit.conversion.run import Candidate, ConvertRun
from toolkit.conversion.edgetpu import compile_for_edgetpu
from toolkit.conversion.tables import bundle_table
from toolkit.errors import UsageError
from toolkit.model.artifact import ArtifactRecord, Golden
from toolkit.model.manifest import BundleTarget, Manifest, SourceRef
from toolkit.model.vocabulary import ArtifactStatus, Framework, Precision

if TYPE_CHECKING:
    from toolkit.model.options import ConvertOptions

GOLDEN_SAMPLES = 8


def write_bundle(run: ConvertRun, options: ConvertOptions, name: str, kept: Sequence[Candidate], staging: Path) -> Manifest:
    """Copy the kept artifacts into ``staging`` with their golden outputs, the runner and ``manifest.json``."""
    policy, source, data, reference, attempts = run.policy, run.source, run.data, run.reference, run.attempts
    golden_count = min(GOLDEN_SAMPLES, len(data.heldout))
    golden_feeds = data.heldout.feeds[:golden_count]
    save_npz(
        staging / GOLDEN_INPUTS,
        {f"input_{i}": np.stack([feed[spec.name] for feed in golden_feeds]) for i, spec in enumerate(source.inputs)},
    )
    save_npz(staging / GOLDEN_REFERENCE, _stack_outputs(reference[:golden_count]))
    records: list[ArtifactRecord] = []
    used: set[str] = set()
    chosen = preferred(kept, options)
    for item in kept:
        record = item.record
        if record.file in used:  # two recipes of one precision and format: keep the first (preferred)
            continue
        used.add(record.file)
        shutil.copyfile(item.built.path, staging / record.file)
        golden_name = golden_outputs_name(record.file)
        outputs = item.outputs[:golden_count]
        save_npz(staging / golden_name, _stack_outputs(outputs))
        # outputs verified slice by slice (boxes next to scores) are checked so on the device too, against
        # the float reference, with the same limit
        slices = verify.golden_slices(record.verification, policy.tolerance)
        golden = Golden(golden_name, _golden_atol(record, outputs), slices=slices,
                        reference=GOLDEN_REFERENCE if slices else None)
        record = dataclasses.replace(record, golden=golden, preferred=any(item is p for p in chosen))
        # what the format adds beside the artifact (ExecuTorch: its bundled program, the device checks itself)
        record = run.backend(record.format).bundled(record, staging, source.inputs, golden_feeds,
                                                    reference[:golden_count], outputs)
        layer_note = bundle_table(run, item, staging)  # INT8: layers/<file>.json, the layer-wise error table
        if layer_note:
            record = dataclasses.replace(record, notes=record.notes + (layer_note,))
            probe_note = _layer_probe(run, item, staging, golden_feeds)
            if probe_note:
                record = dataclasses.replace(record, notes=record.notes + (probe_note,))
        records.append(record)
    if policy.edgetpu:
        records.extend(compile_for_edgetpu(records, policy, attempts, staging))
    labels = _read_labels(options.labels) if options.labels else None
    if options.device_eval:
        from toolkit.conversion.eval_set import write_eval_set

        eval_note = write_eval_set(staging, feeds=data.heldout.feeds, input_names=[s.name for s in source.inputs],
                                   reference=reference, labels=data.heldout.labels, limit=options.device_eval)
        records = [dataclasses.replace(r, notes=r.notes + (eval_note,)) for r in records]
    runner = install_runner(staging)
    manifest = Manifest(
        name=name,
        created_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        toolkit_version=__version__,
        source=SourceRef(path=options.source, sha256=source_hash(options.source), framework=Framework(source.framework)),
        target=BundleTarget(policy.name, policy.arch),
        artifacts=tuple(records),
        golden_inputs=GOLDEN_INPUTS,
        preprocessing=data.preprocessing,
        labels=labels,
        calibration=data.calibration_ref,
        runner=runner,
        attempts=tuple(attempts),
        runtime_preferences=policy.preferences,
        config=options.to_config(),
        check_policy=policy.check,
        on_demand=on_demand.record(staging),  # eval/ and layers/: hashed, pushed only when a check asks
    )
    write_manifest(staging, manifest)
    return manifest


def _layer_probe(run: ConvertRun, item: Candidate, staging: Path, feeds: Sequence[Mapping[str, np.ndarray]]
                 ) -> str | None:
    """The float layers a failed device check compares with (:mod:`toolkit.conversion.layer_probe`); never costs the
    artifact: a failure becomes the note."""
    from toolkit.conversion import layer_probe

    fp32 = run.caches.fp32.get(item.recipe.format)
    float_path = fp32.built.path if isinstance(fp32, Candidate) else None
    try:
        return layer_probe.record(staging, item.record.file, run.backend(item.recipe.format), float_path, feeds,
                                  [s.name for s in run.source.inputs])
    except Exception as exc:  # noqa: BLE001 - a runtime's own error: the artifact stays, the probe is missing
        return f"no layer probe: {type(exc).__name__}: {str(exc)[:200]}"


def preferred(kept: Sequence[Candidate], options: ConvertOptions) -> list[Candidate]:
    """Per format, the artifact the device should run: the first within the tolerance and not slower than fp32, in
    the user's ``--precision`` order, else the profile's recipe (at most one non-fp32 per format) before fp32."""
    chosen: dict[str, Candidate] = {}

    def rank(item: Candidate) -> int:
        if item.explicit and item.recipe.precision in options.precisions:
            return options.precisions.index(item.recipe.precision)
        mixed = item.record.quantized is not None and item.record.quantized.mixed  # after a quantized one
        return 1 if item.recipe.precision == Precision.FP32 or mixed else 0

    # a vacuous verification (status unverified) proves nothing: such an artifact is preferred only where no
    # verified one of its format passed
    for verified in (True, False):
        for item in sorted(kept, key=rank):
            if (not item.problems and item.recipe.format not in chosen
                    and (item.record.status != ArtifactStatus.UNVERIFIED) is verified):
                chosen[item.recipe.format] = item
    return list(chosen.values())


def _stack_outputs(per_sample: Sequence[Sequence[np.ndarray]]) -> dict[str, np.ndarray]:
    if not per_sample:
        return {}
    return {
        f"output_{i}": np.stack([np.asarray(outs[i], dtype=np.float32) for outs in per_sample])
        for i in range(len(per_sample[0]))
    }


GOLDEN_RELATIVE_ATOL: Mapping[Precision, float] = {
    Precision.FP32: 1e-4, Precision.FP16: 1e-2, Precision.DYNAMIC: 5e-2, Precision.INT8: 5e-2,
}


def _golden_atol(record: ArtifactRecord, outputs: Sequence[Sequence[np.ndarray]]) -> float:
    """How far a device may drift from this host's outputs: kernels differ across CPUs (ARM vs x86,
    XNNPACK vs reference), by rounding for float and by a quantization step or two for integer models."""
    magnitude = max((float(np.max(np.abs(o))) for outs in outputs for o in outs if np.size(o)), default=1.0)
    atol = GOLDEN_RELATIVE_ATOL[Precision(record.precision)] * max(1.0, magnitude)
    for spec in record.outputs:
        if spec.quantization and spec.quantization.scale:
            atol = max(atol, 2.0 * max(spec.quantization.scale))
    return float(atol)


def _read_labels(path: Path) -> tuple[str, ...]:
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Cannot read the labels file {path}: {exc}.", hint="One class name a line, UTF-8.") from None
    labels = tuple(line for line in lines if line)
    if not labels:
        raise UsageError(f"The labels file {path} is empty.", hint="One class name a line.")
    return labels

