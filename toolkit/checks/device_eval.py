"""The eval set on the device (``edgetk convert --device-eval N``, ``edgetk check --eval``).

Only the eval inputs (``eval/``) ever go to a device, and only when a check asks: ``deploy`` does not carry
them, so a bundle stays as small on the device as without them. The runner's ``eval`` command writes raw outputs
in the artifact's own dtype with their scale and zero point; the host dequantizes and scores them with the
task metrics convert used (:func:`toolkit.verification.verify.compare`) and judged by the tolerance the bundle
was verified against (its check policy's): an artifact within it on the host that breaks it on the device fails the
check. File layout: docs/verification.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.delivery import on_demand
from toolkit.delivery.bundle import EVAL_DIR, EVAL_LABELS, EVAL_REFERENCE, Bundle, load_npz
from toolkit.errors import UsageError
from toolkit.model.records import JsonDict, JsonObject
from toolkit.model.vocabulary import RunnerErrorKind

if TYPE_CHECKING:
    from toolkit.delivery.deployment import Device
    from toolkit.model.artifact import ArtifactRecord, Verification
    from toolkit.model.device_records import CheckReport
    from toolkit.model.tasks import TaskChoice

INPUT = re.compile(rf"{EVAL_DIR}/input_(\d+)\.npy")
EVAL_TIMEOUT_S = 1800.0
NO_LABELS = "the eval data has no labels (key y): reported is the agreement with the float model only"


def input_files(bundle: Bundle) -> list[str]:
    """The eval inputs the manifest records (bundle-relative), in input order; empty when it records none."""
    indexed = [(int(m.group(1)), f.file) for f in bundle.manifest.on_demand if (m := INPUT.fullmatch(f.file))]
    return [name for _, name in sorted(indexed)]


def missing_note(bundle: Bundle) -> str | None:
    """Why the bundle's eval set cannot be used (None: it can): there is none, or its manifest predates it."""
    if input_files(bundle) and on_demand.recorded(bundle, EVAL_REFERENCE):
        return None
    if (bundle.path / EVAL_DIR).is_dir():
        return f"the bundle's eval set {on_demand.UNRECORDED}: convert again to check it on a device"
    return "the bundle carries no eval set: convert with --device-eval N to add one"


def require_eval_set(bundle: Bundle) -> None:
    """Refuse ``--eval`` for a bundle without a usable eval set, or whose eval files do not match their
    sha256, before any device is contacted."""
    if missing_note(bundle) is not None:
        if (bundle.path / EVAL_DIR).is_dir():
            raise UsageError(f"--eval: the eval set of the bundle {bundle.path} {on_demand.UNRECORDED}.",
                             hint=on_demand.CONVERT_AGAIN)
        raise UsageError(f"--eval: the bundle {bundle.path} carries no eval set.",
                         hint="Convert it with --device-eval N (N held-out samples go into its eval/ folder).")
    for ref in bundle.manifest.on_demand:
        if ref.file.startswith(f"{EVAL_DIR}/"):
            on_demand.verified(bundle, ref.file)


def _dequantized(raw: np.ndarray, spec: JsonObject) -> np.ndarray:
    if spec.get("scale"):
        return (raw.astype(np.float32) - float(spec.get("zero_point") or 0)) * np.float32(spec["scale"])
    return raw.astype(np.float32)


def score(record: ArtifactRecord, reference: Mapping[str, np.ndarray], device_outputs: Sequence[np.ndarray],
          labels: np.ndarray | None) -> Verification:
    """The device's outputs against the float model's and the labels, with the metrics convert used."""
    from toolkit.verification import verify

    refs = [reference[f"output_{k}"] for k in range(len(reference))]
    count = min([len(r) for r in refs] + [len(d) for d in device_outputs])
    actual = [d[:count].reshape(r[:count].shape) for d, r in zip(device_outputs, refs)]
    return verify.compare([[r[i] for r in refs] for i in range(count)], [[a[i] for a in actual] for i in range(count)],
                          labels=labels[:count] if labels is not None else None, task=convert_task(record),
                          output_names=[o.name for o in record.outputs])


def convert_task(record: ArtifactRecord) -> TaskChoice | None:
    """The task and the per-output roles the user declared at convert time (``--task``, ``--output-task``,
    dataset.toml), as convert judged ``record`` with them: the device's outputs are scored by the same roles,
    never re-inferred in their place. None: no verification recorded, everything is inferred."""
    from toolkit.model.roles import OutputDeclaration, Role
    from toolkit.model.tasks import TaskChoice, parse_task

    verification = record.verification
    if verification is None:
        return None
    declared = tuple(OutputDeclaration(o.name, Role(o.role), o.role_source) for o in verification.outputs
                     if o.role and o.role_source and not o.role_source.startswith("inferred"))
    return TaskChoice(parse_task(verification.task, where="the manifest"), verification.task_source or "inferred",
                      declared)


def summary(verification: Verification, *, labels: bool) -> JsonDict:
    """The side-by-side numbers: vs the labels (device and float model), vs the float model (agreement)."""
    data = verification.to_dict()
    return {
        "task": data.get("task"),
        "samples": data.get("samples"),
        "labels": labels,
        "vs_labels": {"device_accuracy": data.get("accuracy"), "float_accuracy": data.get("reference_accuracy")}
        if labels else None,
        "vs_float": {"top1_agreement": data.get("top1_agreement"), "max_abs_error": data.get("max_abs_error"),
                     "cosine_similarity": data.get("cosine_similarity")},
        "task_metrics": data.get("task_metrics") or {},
        "note": None if labels else NO_LABELS,
    }


def evaluate(device: Device, bundle: Bundle, vdir: str, artifacts: Sequence[str], *,
             timeout: float = EVAL_TIMEOUT_S) -> dict[str, JsonDict]:
    """Per artifact: the eval set run on the device and scored here (``{"available": False, "note"}`` when the
    bundle has no usable eval set or the artifact could not run it; ``"refused": True`` as well when the device
    refused an eval input whose sha256 is not the manifest's)."""
    note = missing_note(bundle)
    if note is not None:
        return {a: {"available": False, "note": note} for a in artifacts}
    on_demand.push(device, bundle, vdir, input_files(bundle))
    reference = load_npz(on_demand.verified(bundle, EVAL_REFERENCE))
    labels = (np.load(on_demand.verified(bundle, EVAL_LABELS), allow_pickle=False)
              if on_demand.recorded(bundle, EVAL_LABELS) else None)
    runner = bundle.manifest.runner.file if bundle.manifest.runner else "edgetk_runner.py"
    records = {a.file: a for a in bundle.manifest.artifacts}
    results: dict[str, JsonDict] = {}
    for artifact in artifacts:
        out = f"{vdir}/{EVAL_DIR}/out/{artifact}"
        argv = [device.python, f"{vdir}/{runner}", "eval", "--bundle", vdir, "--artifact", artifact, "--out", out]
        done = device.conn.run(argv, timeout=timeout)
        try:
            doc = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("error") or not doc.get("ok"):
            error = (doc or {}).get("error") or {"message": (done.stderr.strip().splitlines() or ["no output"])[-1]}
            refused = error.get("kind") == RunnerErrorKind.INTEGRITY
            results[artifact] = {"available": False, "note": (
                f"the device refused the eval set: {error.get('message')} {error.get('hint') or ''}".rstrip()
                if refused else f"the device could not run the eval set: {error.get('message')}")}
            if refused:
                results[artifact]["refused"] = True
            continue
        with tempfile.TemporaryDirectory(prefix="edgetk-eval-") as scratch:
            outputs = []
            for spec in doc.get("outputs") or []:
                local = Path(scratch) / str(spec["file"])
                device.conn.get(f"{out}/{spec['file']}", local)
                outputs.append(_dequantized(np.load(local, allow_pickle=False), spec))
        scored = score(records[artifact], reference, outputs, labels)
        result = summary(scored, labels=labels is not None)
        result.update(available=True, chunk=doc.get("chunk"), chunks=doc.get("chunks"), seconds=doc.get("seconds"),
                      runtime=doc.get("runtime"), failures=lost_on_device(records[artifact], scored, bundle))
        results[artifact] = result
    return results


def lost_on_device(record: ArtifactRecord, scored: Verification, bundle: Bundle) -> list[str]:
    """How the device's scores break the tolerance the artifact met on the host (empty when they do not, or when
    the host's own verdict already broke it: its status says so, the device adds nothing)."""
    from toolkit.model.tolerance import Tolerance
    from toolkit.verification.verdict import failures_of

    policy = bundle.manifest.check_policy
    tolerance = Tolerance.from_dict(policy.tolerance) if policy and policy.tolerance is not None else Tolerance()
    if record.verification is not None and failures_of(record.verification, tolerance):
        return []
    judged = record.verification.user_metric if record.verification is not None else None
    if judged and judged.get("covers"):  # --metric judged these outputs on the host; it is not re-run here, and
        # the tensor limits it replaced do not apply to them on the device either (the other outputs' do)
        scored = dataclasses.replace(scored, user_metric={"metric": judged.get("metric"), "values": {}, "ok": True,
                                                          "covers": list(judged["covers"])})
    return failures_of(scored, tolerance)


def attach(report: CheckReport, result: JsonObject | None) -> CheckReport:
    """The report with its eval result. The check fails when the device refused an eval input (its sha256 is not
    the manifest's: the accuracy asked for was not proven, as with a tampered artifact) or when the device's
    scores break the tolerance the host's met (the accuracy was lost on the device)."""
    report = dataclasses.replace(report, evaluation=result)
    result = result or {}
    if result.get("refused"):
        failure = f"{report.artifact}: eval set refused on {report.device}: {result.get('note')}"
    elif result.get("failures"):
        failure = (f"{report.artifact}: on the eval set on {report.device} ({result.get('samples')} samples): "
                   f"{'; '.join(result['failures'])}")
    else:
        return report
    return dataclasses.replace(report, gates=dataclasses.replace(
        report.gates, passed=False, failures=(*report.gates.failures, failure)))
