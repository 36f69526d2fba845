"""The selection rule itself (toolkit/checks/selection.py) on hand-made check reports: ties go to the smaller file,
throttled runs and unverified artifacts decide nothing, a selection is sticky until the version or the runtimes
change, a pin holds until its artifact cannot run. The device tests (test_device_selection.py) run it on real
devices; these pin down the rule's corners, which real timings cannot be made to hit on demand."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit.errors import UsageError
from toolkit.checks.selection import choose
from toolkit.model.runner_report import throttled
from toolkit.model.artifact import ArtifactRecord
from toolkit.model.device_records import CheckReport, GateResult, LatencyStats
from toolkit.model.manifest import BundleTarget, Manifest, SourceRef

pytestmark = pytest.mark.fast
COOL = {"temperature_c": 45.0, "cpu_freq_mhz": 1500.0, "cpu_freq_max_mhz": 1500.0, "governor": "ondemand"}


def _manifest(*artifacts: tuple[str, int, str]) -> Manifest:
    records = tuple(ArtifactRecord(file=f, format=f.rsplit(".", 1)[1], precision=f.split(".")[1], sha256="0" * 64,
                                   bytes=size, inputs=(), outputs=(), verification=None, status=status,
                                   preferred=i == 0)
                    for i, (f, size, status) in enumerate(artifacts))
    return Manifest(name="b", created_at="now", toolkit_version="t", source=SourceRef("m", "0" * 64, "keras"),
                    target=BundleTarget(), artifacts=records)


def _report(artifact: str, level: float, *, runtime: str = "litert", env: dict | None = None,
            passed: bool = True, error: dict | None = None) -> CheckReport:
    samples = tuple(level * (1.0 + 0.01 * (i % 7)) for i in range(30))
    stats = LatencyStats(level, 0.0, min(samples), sorted(samples)[15], max(samples), max(samples), max(samples))
    return CheckReport(device="d", artifact=artifact, runtime={"name": runtime, "version": "1"}, threads=1,
                       load_ms=1.0, first_inference_ms=1.0, latency_ms=None if error else stats, runs=30, warmup=1,
                       peak_rss_mb=1.0, outputs_match={"ok": True}, environment=env or COOL,
                       gates=GateResult(passed, () if passed else ("budget",)), error=error,
                       latency_samples_ms=() if error else samples)


MANIFEST = _manifest(("model.fp32.tflite", 4000, "ok"), ("model.int8.tflite", 1000, "ok"),
                     ("model.fp32.onnx", 4200, "ok"))


def test_the_fastest_wins_and_a_tie_goes_to_the_smaller_file() -> None:
    fast = choose([_report("model.fp32.tflite", 2.0), _report("model.int8.tflite", 1.0),
                   _report("model.fp32.onnx", 3.0, runtime="onnxruntime")], MANIFEST, device="d", version="v")
    assert fast.artifact == "model.int8.tflite" and fast.proposed == "model.fp32.tflite"
    tie = choose([_report("model.fp32.tflite", 1.0), _report("model.int8.tflite", 1.02),
                  _report("model.fp32.onnx", 1.01, runtime="onnxruntime")], MANIFEST, device="d", version="v")
    assert tie.artifact == "model.int8.tflite" and "smallest of 3" in tie.reason


def test_failed_gates_unverified_and_unrunnable_artifacts_are_out() -> None:
    manifest = _manifest(("model.fp32.tflite", 4000, "ok"), ("model.int8.tflite", 1000, "out_of_tolerance"),
                         ("model.fp32.onnx", 4200, "ok"))
    chosen = choose([_report("model.fp32.tflite", 5.0, passed=False), _report("model.int8.tflite", 1.0),
                     _report("model.fp32.onnx", 3.0, error={"kind": "missing_runtime", "message": "no ort"})],
                    manifest, device="d", version="v")
    assert chosen.artifact is None
    why = {c.artifact: c.excluded for c in chosen.contenders}
    assert "budget" in why["model.fp32.tflite"] and "out_of_tolerance" in why["model.int8.tflite"]
    assert why["model.fp32.onnx"].startswith("the device cannot run it") and "no artifact passes" in chosen.reason


def test_runs_taken_while_the_device_throttles_decide_nothing() -> None:
    hot = dict(COOL, temperature_c=83.5)
    capped = dict(COOL, governor="performance", cpu_freq_mhz=600.0)
    assert throttled(hot) and throttled(capped) and throttled(COOL) is None
    assert throttled(dict(COOL, governor="ondemand", cpu_freq_mhz=600.0)) is None  # idle clock, not a cap
    chosen = choose([_report("model.fp32.tflite", 2.0), _report("model.int8.tflite", 1.0, env=hot),
                     _report("model.fp32.onnx", 3.0, runtime="onnxruntime")], MANIFEST, device="d", version="v")
    assert chosen.artifact == "model.fp32.tflite"
    assert "throttled" in next(c.excluded for c in chosen.contenders if c.artifact == "model.int8.tflite")


def test_a_selection_is_sticky_until_the_version_or_the_runtimes_change() -> None:
    reports = [_report("model.fp32.tflite", 1.05), _report("model.int8.tflite", 1.0),
               _report("model.fp32.onnx", 1.0, runtime="onnxruntime")]
    first = choose(reports, MANIFEST, device="d", version="v")
    previous = dict(first.on_device(), artifact="model.fp32.tflite")  # an earlier check chose the fp32 TFLite
    kept = choose(reports, MANIFEST, device="d", version="v", previous=previous)
    assert kept.artifact == "model.fp32.tflite" and not kept.changed and kept.reason.startswith("kept")
    assert choose(reports, MANIFEST, device="d", version="w", previous=previous).artifact == "model.int8.tflite"
    moved = dict(previous, runtimes={"litert": "0.9", "onnxruntime": "1"})
    assert choose(reports, MANIFEST, device="d", version="v", previous=moved).artifact == "model.int8.tflite"
    faster = [dataclasses.replace(r) for r in reports[1:]] + [_report("model.fp32.tflite", 9.0)]
    assert choose(faster, MANIFEST, device="d", version="v", previous=previous).artifact == "model.int8.tflite"


def test_a_pin_holds_until_its_artifact_cannot_run_or_the_version_changes() -> None:
    reports = [_report("model.fp32.tflite", 2.0), _report("model.int8.tflite", 1.0),
               _report("model.fp32.onnx", 3.0, runtime="onnxruntime")]
    pinned = choose(reports, MANIFEST, device="d", version="v", pin="model.fp32.onnx")
    assert pinned.artifact == "model.fp32.onnx" and pinned.pinned
    again = choose(reports, MANIFEST, device="d", version="v", previous=pinned.on_device())
    assert again.artifact == "model.fp32.onnx" and again.pinned and not again.changed
    assert choose(reports, MANIFEST, device="d", version="w", previous=pinned.on_device()).artifact == \
        "model.int8.tflite"
    gone = [*reports[:2], _report("model.fp32.onnx", 0, error={"kind": "missing_runtime", "message": "x"})]
    dropped = choose(gone, MANIFEST, device="d", version="v", previous=pinned.on_device())
    assert dropped.artifact == "model.int8.tflite" and "pin on model.fp32.onnx was dropped" in dropped.reason
    with pytest.raises(UsageError, match="no artifact of that name"):
        choose(reports, MANIFEST, device="d", version="v", pin="model.fp16.tflite")


def test_an_unverified_artifact_is_selected_only_where_no_verified_one_passes() -> None:
    manifest = _manifest(("model.fp32.tflite", 4000, "ok"), ("model.int8.tflite", 1000, "unverified"))
    reports = [_report("model.fp32.tflite", 2.0), _report("model.int8.tflite", 1.0)]
    assert choose(reports, manifest, device="d", version="v").artifact == "model.fp32.tflite"
    alone = _manifest(("model.fp32.tflite", 4000, "unverified"), ("model.int8.tflite", 1000, "unverified"))
    assert choose(reports, alone, device="d", version="v").artifact == "model.int8.tflite"


def test_a_mixed_int8_is_named_mixed_wherever_the_selection_names_it() -> None:
    """An int8 artifact with 2% of its weights in integer (``QuantizedShare.mixed``) is ``int8 mixed`` in the
    selection's document, its terminal lines (check, run, deploy --check), the device's status line and the
    report's table, beside a plainly quantized one that gets no label."""
    from toolkit.api.results import DeviceResult
    from toolkit.cli.deploy_cmd import _render_status
    from toolkit.model.answers import InstalledBundle, StatusAnswer
    from toolkit.model.quantized import QuantizedShare
    from toolkit.reporting.html import selection_rows
    from toolkit.reporting.terminal import selection_lines

    mixed = QuantizedShare(weights=0.02, macs=0.3, quantized_bytes=100, float_bytes=20000)
    plain = _manifest(("model.fp32.tflite", 4000, "ok"), ("model.int8.tflite", 1000, "ok"),
                      ("model.int8.onnx", 1100, "ok"))
    manifest = dataclasses.replace(plain, artifacts=tuple(
        dataclasses.replace(a, quantized=mixed) if a.file == "model.int8.tflite" else a for a in plain.artifacts))
    label = "int8 mixed: 2% of weights int"

    chosen = choose([_report("model.fp32.tflite", 2.0), _report("model.int8.tflite", 1.0),
                     _report("model.int8.onnx", 3.0, runtime="onnxruntime", passed=False)],
                    manifest, device="d", version="v")
    doc = chosen.to_dict()
    assert chosen.artifact == "model.int8.tflite" and doc["label"] == label
    assert {c["artifact"]: c["label"] for c in doc["contenders"]} == {
        "model.fp32.tflite": None, "model.int8.tflite": label, "model.int8.onnx": None}
    assert selection_lines(doc)[0].startswith(f"selected: model.int8.tflite ({label}, p50 1.030 ms): ")
    assert "  not selectable: model.int8.onnx: budget" in selection_lines(doc)
    answer = InstalledBundle(current="v", selected=chosen.on_device(), versions=())
    status = _render_status(DeviceResult("d", True, None, 0, answer=StatusAnswer(bundles={"b": answer})))
    assert status[0].startswith(f"  selected: model.int8.tflite ({label}) (p50 1.030 ms)"), status
    assert selection_rows([dict(doc, device="d", bundle="b")])[0][2] == f"model.int8.tflite ({label})"

    proposing = dataclasses.replace(manifest, artifacts=tuple(
        dataclasses.replace(a, preferred=a.file == "model.int8.tflite") for a in manifest.artifacts))
    faster_fp32 = choose([_report("model.fp32.tflite", 1.0), _report("model.int8.tflite", 3.0)], proposing,
                         device="d", version="v").to_dict()
    assert faster_fp32["artifact"] == "model.fp32.tflite" and faster_fp32["label"] is None
    assert selection_lines(faster_fp32)[0].startswith("selected: model.fp32.tflite (p50 1.030 ms): ")
    assert f"  the manifest proposed model.int8.tflite ({label}); this device's measurements decided" in \
        selection_lines(faster_fp32)
