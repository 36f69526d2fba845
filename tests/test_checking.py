"""Parsing the runner's JSON and the gates (budget, outputs, regression, errors), without timing noise."""

from __future__ import annotations

import json

import pytest

from toolkit.checking import GateOptions, gate, parse_runner_output, profile_budget
from toolkit.errors import DeviceError, UsageError
from toolkit.store import StoredCheck

RUNNER_DOC = {
    "runner_version": "1",
    "ok": True,
    "environment": {"arch": "aarch64", "cpu_model": "Cortex-A72", "temperature_c": 51.2},
    "reports": [
        {"artifact": "model.int8.tflite", "runtime": {"name": "litert", "version": "2.3.0"}, "threads": 4,
         "load_ms": 3.0, "first_inference_ms": 9.0,
         "latency_ms": {"mean": 5.0, "std": 0.2, "min": 4.8, "p50": 5.0, "p90": 5.5, "p99": 6.0, "max": 7.0},
         "runs": 50, "warmup": 5, "peak_rss_mb": 40.0,
         "outputs_match": {"max_abs_error": 0.01, "top1_agreement": 1.0, "ok": True}, "error": None},
        {"artifact": "model.fp32.onnx", "runtime": {"name": None, "version": None}, "latency_ms": None,
         "outputs_match": None, "runs": 0, "warmup": 0,
         "error": {"kind": "missing_runtime", "message": "onnxruntime is not installed",
                   "hint": "pip install onnxruntime"}},
    ],
    "error": None,
}


def _baseline(p50: float) -> StoredCheck:
    return StoredCheck("r1-0", "r1", "2026-01-01", "pi", "m", "v", "model.int8.tflite", True, p50, p50, {})


def test_parse_and_gate() -> None:
    ok, missing = parse_runner_output(json.dumps(RUNNER_DOC), device="pi", artifacts=["model.int8.tflite"])
    assert ok.device == "pi" and ok.latency_ms is not None and ok.latency_ms.p90 == 5.5
    assert ok.environment["temperature_c"] == 51.2

    kwargs = dict(budget_source="--budget-ms", budget_skip=None, regression_pct=10.0)
    assert gate(ok, budget_ms=6.0, baseline=_baseline(4.8), **kwargs).passed  # type: ignore[arg-type]
    over = gate(ok, budget_ms=5.0, baseline=None, **kwargs)  # type: ignore[arg-type]
    assert not over.passed and "p90 5.500 ms exceeds the budget of 5 ms" in over.reasons[0]
    slower = gate(ok, budget_ms=100.0, baseline=_baseline(4.0), **kwargs)  # type: ignore[arg-type]
    assert not slower.passed and "25.0% slower than baseline r1-0" in slower.reasons[0]
    skipped = gate(ok, budget_ms=None, baseline=None, budget_source="", budget_skip="no target",  # type: ignore[arg-type]
                   regression_pct=10.0)
    assert skipped.passed and skipped.reasons == ("skipped: latency budget gate (no target)",)

    failed = gate(missing, budget_ms=100.0, baseline=None, **kwargs)  # type: ignore[arg-type]
    assert not failed.passed and "missing_runtime" in failed.reasons[0] and "pip install onnxruntime" in failed.reasons[0]

    mismatch = json.loads(json.dumps(RUNNER_DOC))
    mismatch["reports"][0]["outputs_match"]["ok"] = False
    bad, _ = parse_runner_output(json.dumps(mismatch), device="pi", artifacts=[])
    assert "outputs differ" in gate(bad, budget_ms=100.0, baseline=None, **kwargs).reasons[0]  # type: ignore[arg-type]


def test_top_level_runner_error_becomes_a_report_per_artifact() -> None:
    doc = {"runner_version": "1", "ok": False, "environment": {}, "reports": [],
           "error": {"kind": "bad_bundle", "message": "manifest.json missing", "hint": None}}
    reports = parse_runner_output(json.dumps(doc), device="pi", artifacts=["a.tflite", "b.onnx"])
    assert [r.artifact for r in reports] == ["a.tflite", "b.onnx"]
    assert all(r.error and r.error["kind"] == "bad_bundle" for r in reports)
    with pytest.raises(DeviceError, match="no JSON"):
        parse_runner_output("Traceback ...", device="pi", artifacts=[])


def test_profile_budget_and_options() -> None:
    budget, why = profile_budget("generic-x86_64")
    assert (budget is not None and budget > 0) or why
    assert profile_budget(None) == (None, "the bundle names no target profile")
    budget, why = profile_budget("no-such-board")
    assert budget is None and "no-such-board" in (why or "")
    with pytest.raises(UsageError):
        GateOptions(budget_ms=0)
    with pytest.raises(UsageError):
        GateOptions(regression_pct=-1)
