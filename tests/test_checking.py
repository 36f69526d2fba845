"""Parsing the runner's JSON and the gates (budget, outputs, regression statistics, placement, errors), on fixed
inputs: no device and no timing here (tests/test_gates_device.py measures the gates on a real device)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from toolkit.checks.checking import GateOptions
from toolkit.checks.gates import GATES, Evidence, Limits, judge
from toolkit.checks.gates.gate import NO_POLICY, Verdict
from toolkit.model.policy import Budget, budget_for
from toolkit.model.runner_report import parse_runner_output
from toolkit.errors import DeviceError, UsageError
from toolkit.model.policy import CheckPolicy, PlacementExpectation, RegressionPolicy
from toolkit.model.targets import check_policy_from_profile
from toolkit.regression import RegressionVerdict, decide, mann_whitney_greater, median
from toolkit.model.reading import read_record
from toolkit.model.manifest import read_manifest
from toolkit.model.device_records import GateResult

pytestmark = pytest.mark.fast  # no device, no conversion: part of the edit-test loop

RUNNER_DOC = {
    "runner_version": "1",
    "ok": True,
    "environment": {"arch": "aarch64", "cpu_model": "Cortex-A72", "temperature_c": 51.2},
    "reports": [
        {"artifact": "model.int8.tflite", "runtime": {"name": "litert", "version": "2.3.0"}, "threads": 4,
         "load_ms": 3.0, "first_inference_ms": 9.0,
         "latency_ms": {"mean": 5.0, "std": 0.2, "min": 4.8, "p50": 5.0, "p90": 5.5, "p99": 6.0, "max": 7.0},
         "latency_samples_ms": [5.0, 4.9, 5.1, 5.5, 4.8, 5.0, 6.0, 5.2],
         "runs": 8, "warmup": 5, "peak_rss_mb": 40.0,
         "outputs_match": {"max_abs_error": 0.01, "top1_agreement": 1.0, "ok": True}, "error": None},
        {"artifact": "model.fp32.onnx", "runtime": {"name": None, "version": None}, "latency_ms": None,
         "outputs_match": None, "runs": 0, "warmup": 0,
         "error": {"kind": "missing_runtime", "message": "onnxruntime is not installed",
                   "hint": "pip install onnxruntime"}},
    ],
    "error": None,
}
POLICY = RegressionPolicy()
NO_BUDGET = Budget(None, skip="latency budget: the target t sets none")
BUDGET_100 = Limits(CheckPolicy(), GateOptions(budget_ms=100.0))  # --budget-ms 100, the policy's defaults


def gate(report, limits: Limits, *, regression: RegressionVerdict | None = None,  # type: ignore[no-untyped-def]
         fmt: str | None = None):
    """The check's gates (``GATES``, folded) on one report, no baseline asked for unless ``regression``."""
    return judge(Evidence(report, artifact_format=fmt, regression=regression), limits)


def _reports() -> list:  # type: ignore[type-arg]
    return parse_runner_output(json.dumps(RUNNER_DOC), device="pi", artifacts=["model.int8.tflite"])


def test_parse_and_gate_budget_outputs_errors() -> None:
    ok, missing = _reports()
    assert ok.device == "pi" and ok.latency_ms is not None and ok.latency_ms.p90 == 5.5
    assert ok.environment["temperature_c"] == 51.2
    assert ok.latency_samples_ms == (5.0, 4.9, 5.1, 5.5, 4.8, 5.0, 6.0, 5.2)
    assert ok.to_dict()["latency_samples_ms"][0] == 5.0  # stored with the check in the history

    passed = gate(ok, Limits(CheckPolicy(), GateOptions(budget_ms=6.0)))
    assert passed.passed and passed.failures == () and passed.skipped == ()
    over = gate(ok, Limits(CheckPolicy(target="pi", latency_budget_ms=5.0)))
    assert not over.passed and over.failures == ("model.int8.tflite: p90 5.500 ms exceeds the budget of 5 ms "
                                                 "(target pi)",)
    skipped = gate(ok, Limits(CheckPolicy(target="t")))
    assert skipped.passed and skipped.failures == () and skipped.skipped == (NO_BUDGET.skip,)
    assert skipped.to_dict() == {"passed": True, "reasons": [], "skipped": [NO_BUDGET.skip], "details": {}}

    failed = gate(missing, BUDGET_100)
    assert not failed.passed and "missing_runtime" in failed.failures[0]
    assert "pip install onnxruntime" in failed.failures[0]

    mismatch = json.loads(json.dumps(RUNNER_DOC))
    mismatch["reports"][0]["outputs_match"]["ok"] = False
    bad, _ = parse_runner_output(json.dumps(mismatch), device="pi", artifacts=[])
    result = gate(bad, BUDGET_100)
    assert not result.passed and "outputs differ" in result.failures[0]


def test_gates_fold_in_list_order_and_a_report_that_did_not_run_is_judged_no_further() -> None:
    """A gate is one entry of the list: its verdict is folded after the gates before it; the `ran` gate's verdict
    on an error is final, and the note that the bundle carries no policy stays."""
    ok, missing = _reports()

    class Extra:  # a gate of one's own, one entry appended to GATES
        def judge(self, evidence: Evidence, limits: Limits) -> Verdict:
            return Verdict((f"{evidence.report.artifact}: extra",), ("extra note",), {"extra": 1})

    gates = (*GATES, Extra())
    result = judge(Evidence(ok), Limits(CheckPolicy(target="pi", latency_budget_ms=5.0)), gates)
    assert result.failures == ("model.int8.tflite: p90 5.500 ms exceeds the budget of 5 ms (target pi)",
                               "model.int8.tflite: extra")
    assert result.skipped == ("extra note",) and result.details == {"extra": 1}
    stopped = judge(Evidence(missing), Limits(None), gates)
    assert len(stopped.failures) == 1 and stopped.failures[0].startswith("model.fp32.onnx: could not run")
    assert stopped.skipped == (NO_POLICY,) and stopped.details == {}


def test_gate_result_keeps_failures_and_skips_apart() -> None:
    with pytest.raises(ValueError):
        GateResult(True, ("p90 over budget",))
    with pytest.raises(ValueError):
        GateResult(False)
    result = GateResult(False, ("slow",), ("no budget",))
    assert result.reasons == ("slow",)  # the JSON contract's key: failures only, never a skip note


def test_top_level_runner_error_becomes_a_report_per_artifact() -> None:
    doc = {"runner_version": "1", "ok": False, "environment": {}, "reports": [],
           "error": {"kind": "bad_bundle", "message": "manifest.json missing", "hint": None}}
    reports = parse_runner_output(json.dumps(doc), device="pi", artifacts=["a.tflite", "b.onnx"])
    assert [r.artifact for r in reports] == ["a.tflite", "b.onnx"]
    assert all(r.error and r.error["kind"] == "bad_bundle" for r in reports)
    with pytest.raises(DeviceError, match="no JSON"):
        parse_runner_output("Traceback ...", device="pi", artifacts=[])


def test_mann_whitney_matches_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")  # scipy comes with scikit-learn in the test extra
    rng = np.random.default_rng(0)
    cases = [
        (rng.normal(1.0, 1.0, 50), rng.normal(0.0, 1.0, 250)),
        (np.round(rng.normal(0.0, 1.0, 30), 1), np.round(rng.normal(0.1, 1.0, 40), 1)),  # many ties
        (rng.normal(0.0, 1.0, 7), rng.normal(0.0, 1.0, 9)),
    ]
    for x, y in cases:
        want = scipy_stats.mannwhitneyu(x, y, alternative="greater", method="asymptotic").pvalue
        assert mann_whitney_greater(list(x), list(y)) == pytest.approx(want, rel=1e-9)
    assert mann_whitney_greater([1.0] * 10, [1.0] * 10) == 1.0


def _run(rng: np.random.Generator, level: float, n: int = 50) -> list[float]:
    """One runner process's samples: a level plus a right-skewed jitter (as measured latencies are)."""
    return list(level * (1.0 + rng.gamma(2.0, 0.02, n)))


def test_bimodal_processes_are_not_regressions_but_real_slowdowns_are() -> None:
    """Process medians on one of two levels 1.5x apart (findings.md section 5): drawn from the same two levels,
    a check is never a regression, whichever level it and its baseline landed on; 2x is, every time."""
    rng = np.random.default_rng(7)
    false, caught = 0, 0
    for _ in range(200):
        baseline = [(f"c{i}", _run(rng, 28.0 if rng.random() < 0.5 else 44.0)) for i in range(5)]
        levels_seen = {round(median(s)) // 10 for _, s in baseline}
        current = _run(rng, 44.0 if rng.random() < 0.5 else 28.0)
        verdict = decide(current, baseline, POLICY)
        false += bool(verdict.regressed) and len(levels_seen) > 1
        caught += bool(decide(_run(rng, 2.0 * 44.0), baseline, POLICY).regressed)
    assert false == 0 and caught == 200


def test_minimum_effects_and_skips() -> None:
    rng = np.random.default_rng(3)
    base = [(f"c{i}", _run(rng, 0.005)) for i in range(5)]
    micro = decide(_run(rng, 0.0057), base, POLICY)  # +14% of 5 microseconds: significant, but not 0.2 ms
    assert micro.p_value is not None and micro.p_value < POLICY.alpha and micro.regressed is False
    slight = decide(_run(rng, 1.1 * 30.0), [(f"c{i}", _run(rng, 30.0)) for i in range(5)], POLICY)
    assert slight.regressed is False and slight.ratio is not None and slight.ratio < 1.25  # +10% < +25%
    strict = decide(_run(rng, 1.1 * 30.0), [(f"c{i}", _run(rng, 30.0)) for i in range(5)],
                    RegressionPolicy(min_slowdown_pct=5.0))
    assert strict.regressed is True
    few = decide(_run(rng, 60.0), base[:2], POLICY)
    assert few.regressed is None and few.skip and "2 of the 5 earlier checks it compares with so far" in few.skip
    one = decide(_run(rng, 60.0), base[:1], POLICY, min_checks=1)  # --baseline CHECK_ID
    assert one.regressed is True
    short = decide([60.0, 61.0], base, POLICY)
    assert short.regressed is None and "--runs 5" in (short.skip or "")


def test_regression_gate_reason_and_skip_note() -> None:
    ok, _ = _reports()
    verdict = RegressionVerdict(True, current_p50_ms=5.0, reference_ms=2.0, pooled_p50_ms=1.9, ratio=2.5,
                                p_value=1e-12, baseline_checks=("a", "b", "c"), baseline_samples=150)
    result = gate(ok, BUDGET_100, regression=verdict)
    assert not result.passed
    assert result.failures[0].startswith("model.int8.tflite: p50 5.000 ms is 2.50x the slowest of the last 3 checks")
    assert result.details["regression"]["ratio"] == 2.5
    waiting = RegressionVerdict(None, skip="1 of the 5 earlier checks it compares with so far")
    result = gate(ok, BUDGET_100, regression=waiting)
    assert result.passed and result.skipped == (f"regression of model.int8.tflite: {waiting.skip}",)


def _onnx_report(runtime: dict, placement: dict | None = None):  # type: ignore[no-untyped-def,type-arg]
    doc = json.loads(json.dumps(RUNNER_DOC))
    item = doc["reports"][0]
    item.update(artifact="model.fp32.onnx", runtime=runtime, placement=placement)
    return parse_runner_output(json.dumps({**doc, "reports": [item]}), device="jetson", artifacts=[])[0]


def test_placement_gate() -> None:
    trt = PlacementExpectation(format="onnx", on="TensorrtExecutionProvider", min_nodes_pct=90)
    limits = Limits(CheckPolicy(placement=(trt,)), GateOptions(budget_ms=100.0))

    def judged(report):  # type: ignore[no-untyped-def]
        return gate(report, limits, fmt="onnx")

    absent = _onnx_report({"name": "onnxruntime", "version": "1.31.1", "providers": ["CPUExecutionProvider"],
                           "providers_missing": ["TensorrtExecutionProvider"]})
    result = judged(absent)
    assert not result.passed
    assert "no node ran on TensorrtExecutionProvider (this onnxruntime does not have it" in result.failures[0]
    partial = _onnx_report(
        {"name": "onnxruntime", "version": "1.31.1", "providers": ["TensorrtExecutionProvider",
                                                                   "CPUExecutionProvider"]},
        {"intended": "TensorrtExecutionProvider", "nodes_total": 10, "nodes_on_intended": 7,
         "time_share_on_intended": 0.6,
         "fallback_ops": [{"name": "nms", "op_type": "NonMaxSuppression", "on": "CPUExecutionProvider"},
                          "TopK topk_1", {"name": "gather_3", "op_type": "Gather"}]})
    result = judged(partial)
    assert not result.passed
    assert result.failures == ("model.fp32.onnx: 7 of 10 nodes (70%) ran on TensorrtExecutionProvider; the target "
                               "expects at least 90%; fell back: NonMaxSuppression nms (on CPUExecutionProvider), "
                               "TopK topk_1, Gather gather_3",)
    full = _onnx_report({"name": "onnxruntime", "providers": ["TensorrtExecutionProvider"]},
                        {"intended": "TensorrtExecutionProvider", "nodes_total": 10, "nodes_on_intended": 10})
    assert judged(full).passed
    unreported = judged(_onnx_report({"name": "onnxruntime", "providers": ["TensorrtExecutionProvider"]}))
    assert unreported.passed and "reported no per-node placement" in unreported.skipped[0]
    other = gate(absent, limits, fmt="tflite")
    assert other.passed  # an expectation applies to its format (and file glob) only
    tpu = PlacementExpectation(format="tflite", on="edgetpu", artifacts="*_edgetpu.tflite")
    assert tpu.applies_to("model.int8_edgetpu.tflite", "tflite") and not tpu.applies_to("model.fp32.tflite", "tflite")
    with pytest.raises(UsageError):
        PlacementExpectation(format="tflite", on="TensorrtExecutionProvider")
    with pytest.raises(UsageError):
        PlacementExpectation(format="onnx", on="CUDAExecutionProvider", min_nodes_pct=0)


def test_policy_in_the_manifest_and_the_budget_from_it() -> None:
    from toolkit.model.targets import get_profile

    profile = get_profile("generic-x86_64")
    policy = check_policy_from_profile(profile)
    assert policy.target == "generic-x86_64" and policy.latency_budget_ms == profile.latency_budget_ms
    assert read_record(CheckPolicy, json.loads(json.dumps(policy.to_dict())), docs="") == policy
    assert budget_for(policy, GateOptions()) == Budget(profile.latency_budget_ms, "target generic-x86_64")
    assert budget_for(policy, GateOptions(budget_ms=3.0)) == Budget(3.0, "--budget-ms")
    assert budget_for(None, GateOptions()) == Budget(None)  # check adds the one NO_POLICY note instead
    assert Limits(policy, GateOptions(regression_pct=7.0)).regression.min_slowdown_pct == 7.0
    assert Limits(None, GateOptions()).regression == RegressionPolicy()
    manifest = {"schema_version": 1, "name": "m", "created_at": "now", "toolkit_version": "t",
                "source": {"path": "m.onnx", "sha256": "0" * 64, "framework": "onnx"}, "target": {"name": None},
                "artifacts": []}
    assert read_manifest(manifest).check_policy is None  # a bundle from before the policy existed
    loaded = read_manifest({**manifest, "check_policy": policy.to_dict()})
    assert loaded.check_policy == policy and loaded.to_dict()["check_policy"] == policy.to_dict()
    with pytest.raises(UsageError, match="check_policy"):
        read_manifest({**manifest, "check_policy": {"latency_budget_ms": "fast"}})


def test_options_refuse_bad_values() -> None:
    with pytest.raises(UsageError):
        GateOptions(budget_ms=0)
    with pytest.raises(UsageError):
        GateOptions(regression_pct=-1)
    with pytest.raises(UsageError):
        RegressionPolicy(alpha=1.5)
    with pytest.raises(UsageError):
        RegressionPolicy(baseline_checks=2, min_baseline_checks=3)


def test_baseline_is_the_last_checks_that_measured_and_were_not_regressions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Read from a real history: other devices, other artifacts, failed runs, regressions and impossible figures
    are left out; other versions of the bundle (a new model under the same name) are in."""
    from toolkit.checks.checking import baseline_samples
    from toolkit.store import Store
    from toolkit.model.device_records import CheckReport, LatencyStats

    def report(device: str, artifact: str, level: float, *, regressed: bool = False,
               error: bool = False) -> CheckReport:
        lat = LatencyStats(mean=level, std=0.0, min=level, p50=level, p90=level, p99=level, max=level)
        gates = (GateResult(False, ("slower",), details={"regression": {"regressed": True}}) if regressed
                 else GateResult(True))
        return CheckReport(
            device=device, artifact=artifact, runtime={}, threads=1, load_ms=1.0, first_inference_ms=1.0,
            latency_ms=None if error else lat, runs=5, warmup=0, peak_rss_mb=None, outputs_match=None,
            environment={}, gates=GateResult(False, ("could not run",)) if error else gates,
            error={"kind": "crash", "message": "x", "hint": None} if error else None,
            latency_samples_ms=() if error else (level,) * 5,
        )

    store = Store(tmp_path / "h.sqlite")
    plan = [("v1", report("pi", "a.onnx", 1.0)), ("v1", report("pi", "b.onnx", 9.0)),
            ("v1", report("jetson", "a.onnx", 7.0)), ("v1", report("pi", "a.onnx", 2.0)),
            ("v2", report("pi", "a.onnx", 3.0)), ("v2", report("pi", "a.onnx", 8.0, regressed=True)),
            ("v2", report("pi", "a.onnx", 0.0, error=True)), ("v2", report("pi", "a.onnx", 4.0)),
            ("v2", report("pi", "a.onnx", -1.0))]  # recorded before figures were validated: no baseline
    for index, (version, item) in enumerate(plan):
        store.record([item], bundle="m", version=version, run_id=f"r{index}")
    runs = baseline_samples(store, bundle="m", device="pi", artifact="a.onnx", checks=3)
    assert [(check_id, samples[0]) for check_id, samples in runs] == [("r3-0", 2.0), ("r4-0", 3.0), ("r7-0", 4.0)]
    assert baseline_samples(store, bundle="m", device="pi", artifact="a.onnx", checks=10)[0] == ("r0-0", [1.0] * 5)


def test_placement_is_reported_but_not_judged_on_an_emulated_device() -> None:
    """Under qemu-user XNNPACK takes no LiteRT node: a Pi profile's XNNPACK >= 40% would fail every emulated check,
    which says nothing of the real board. The same report from a real device still fails."""
    xnnpack = PlacementExpectation(format="tflite", on="xnnpack", min_nodes_pct=40)
    fell_back = {"intended": "xnnpack", "nodes_total": 12, "nodes_on_intended": 0, "fell_back": True,
                 "fallback_ops": [{"name": "conv", "op_type": "CONV_2D", "on": "cpu"}]}

    def judged(emulated: bool):  # type: ignore[no-untyped-def]
        doc = json.loads(json.dumps(RUNNER_DOC))
        item = doc["reports"][0]
        item.update(artifact="model.fp32.tflite", placement=fell_back)
        doc["environment"] = {**(doc.get("environment") or {}), "arch": "aarch64", "emulated": emulated}
        (report,) = parse_runner_output(json.dumps({**doc, "reports": [item]}), device="pi", artifacts=[])
        return gate(report, Limits(CheckPolicy(placement=(xnnpack,)), GateOptions(budget_ms=100.0)), fmt="tflite")

    real = judged(False)
    assert not real.passed and "0 of 12 nodes (0%) ran on xnnpack" in real.failures[0]
    emulated = judged(True)
    assert emulated.passed, emulated.failures
    (note,) = [s for s in emulated.skipped if s.startswith("placement of model.fp32.tflite")]
    assert "not judged on an emulated device" in note and "0 of 12 nodes (0%) ran on xnnpack" in note
    assert emulated.details["placement"][0]["judged"] is False and emulated.details["placement"][0]["nodes_total"] == 12


def test_a_pte_placement_is_judged_on_an_emulated_device_too() -> None:
    """A .pte's delegation is fixed in the program when it is lowered (the runner reports the manifest's count):
    emulation changes nothing of it, so a `pte` row fails an emulated check as it fails a real one."""
    row = PlacementExpectation(format="pte", on="xnnpack", min_nodes_pct=95)
    counted = {"intended": "XNNPACK", "nodes_total": 10, "nodes_on_intended": 9, "fell_back": False,
               "fallback_ops": [], "source": "graph"}
    for emulated in (False, True):
        doc = json.loads(json.dumps(RUNNER_DOC))
        item = {**doc["reports"][0], "artifact": "model.fp32.pte", "placement": counted}
        doc["environment"] = {**(doc.get("environment") or {}), "arch": "aarch64", "emulated": emulated}
        (report,) = parse_runner_output(json.dumps({**doc, "reports": [item]}), device="pi", artifacts=[])
        result = gate(report, Limits(CheckPolicy(placement=(row,)), GateOptions(budget_ms=100.0)), fmt="pte")
        assert result.failures == ("model.fp32.pte: 9 of 10 nodes (90%) ran on xnnpack; the target expects at "
                                   "least 95%",), (emulated, result)
        assert not any(s.startswith("placement of") for s in result.skipped)
