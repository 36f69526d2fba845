"""The runner's report read as evidence, on fixed inputs (no device): its frame (whole, cut, changed, noise around
it, a runner from before the frame), every figure validated (the field and value named), and the host's marks and
memory words the runner's own. tests/faults/test_runner_word.py runs the same cases through a real device."""

from __future__ import annotations

import ast
import copy
import hashlib
import json
from typing import Any

import pytest

from toolkit import device_side
from toolkit.checks import runner_fate
from toolkit.checks.gates import Evidence, Limits, judge
from toolkit.model import runner_frame
from toolkit.model.runner_frame import read_frame, unframed_document
from toolkit.model.runner_report import expected_samples, invalid_figure, parse_runner_output

pytestmark = pytest.mark.fast

RUNNER = device_side.source_path(device_side.RUNNER_FILE)  # the assembled file, as the device runs it
REPORT: dict[str, Any] = {"artifact": "model.int8.tflite", "runtime": {"name": "litert", "version": "2.3.0"}, "threads": 4,
          "load_ms": 3.0, "first_inference_ms": 9.0,
          "latency_ms": {"mean": 5.0, "std": 0.2, "min": 4.8, "p50": 5.0, "p90": 5.5, "p99": 6.0, "max": 7.0},
          "latency_samples_ms": [5.0, 4.9, 5.1, 5.5, 4.8, 5.0, 6.0, 7.0], "runs": 8, "warmup": 2,
          "peak_rss_mb": 40.0, "outputs_match": {"ok": True}, "error": None}


def _framed(doc: dict[str, Any]) -> str:
    data = (json.dumps(doc) + "\n").encode()
    head = f"\x1eedgetk-report {len(data)} {hashlib.sha256(data).hexdigest()}\n"
    return head + data.decode() + "\x1eedgetk-report-end\n"


def _runner_constant(name: str) -> Any:
    """The value the runner assigns to ``name`` (a literal, or the pattern of a ``re.compile``)."""
    tree = ast.parse(RUNNER.read_text())
    (node,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]
    return ast.literal_eval(node.args[0] if isinstance(node, ast.Call) else node)


def test_the_host_reads_the_runners_marks_and_memory_words() -> None:
    assert _runner_constant("REPORT_MARK") == runner_frame.REPORT_MARK
    assert _runner_constant("MEMORY_MARK") == runner_frame.MEMORY_MARK
    assert _runner_constant("MEMORY_WORDS") == runner_fate.MEMORY_WORDS.pattern
    assert _runner_constant("OOM_HINT") == runner_fate.OOM_HINT


def test_a_whole_frame_is_read_and_what_is_outside_is_kept_apart() -> None:
    doc = {"runner_version": "2", "reports": [REPORT]}
    noisy = "sitecustomize says hello\n" + _framed(doc) + "bye\n"
    frame = read_frame(noisy)
    assert frame.document is not None and json.loads(frame.document) == doc and frame.problem is None
    assert frame.outside == "sitecustomize says hello\nbye\n"
    assert "sitecustomize says hello" in frame.shown_outside()


@pytest.mark.parametrize("damage, problem", [
    (lambda text: text[:150], "its report was cut after"),
    (lambda text: text.replace('"p50": 5.0', '"p50": 1.0'), "does not match its sha256"),
    (lambda text: text.replace("\x1eedgetk-report-end\n", ""), "has no end mark"),
    (lambda text: text[:10], "first line was cut"),
    (lambda text: "", "printed no framed report"),
])
def test_a_damaged_frame_is_no_report(damage: Any, problem: str) -> None:
    frame = read_frame(damage(_framed({"runner_version": "2", "reports": [REPORT]})))
    assert frame.document is None and problem in str(frame.problem), frame


def test_a_runner_from_before_the_frame_is_read_only_when_its_json_is_alone() -> None:
    old = json.dumps({"runner_version": "1", "reports": [REPORT]})
    assert unframed_document(old + "\n") == old
    assert unframed_document("hello\n" + old) is None
    assert unframed_document(json.dumps({"runner_version": "2", "reports": []})) is None  # v2 must frame


def _broken(**changes: Any) -> dict[str, Any]:
    item = copy.deepcopy(REPORT)
    for key, value in changes.items():
        if key in item["latency_ms"]:
            item["latency_ms"][key] = value
        else:
            item[key] = value
    return item


@pytest.mark.parametrize("item, named", [
    (_broken(p50=-1.0), "latency_ms.p50 is -1.0 (a latency must be positive)"),
    (_broken(mean=float("nan")), "latency_ms.mean is NaN (a latency must be a finite number)"),
    (_broken(max=float("inf")), "latency_ms.max is Infinity"),
    (_broken(p90=None), "latency_ms.p90 is null"),
    (_broken(p90=6.5), "latency_ms.p90 6.5 is above latency_ms.p99 6.0"),
    (_broken(mean=9.0), "latency_ms.mean 9.0 is outside min..max"),
    (_broken(min=0.0), "latency_ms.min is 0.0 (a latency must be positive)"),
    (_broken(latency_samples_ms=[5.0] * 7 + [-2.0]), "latency_samples_ms[7] is -2.0"),
    (_broken(latency_samples_ms=[5.0] * 3), "latency_samples_ms holds 3 samples, but 8 timed runs give 8"),
    (_broken(runs=0), "runs is 0"),
    (_broken(runs=7.5), "runs is 7.5"),
    (_broken(peak_rss_mb=-3.0), "peak_rss_mb is -3.0 (memory must be finite and positive)"),
    (_broken(load_ms=-1.0), "load_ms is -1.0"),
])
def test_an_impossible_figure_is_named_with_its_value(item: dict[str, Any], named: str) -> None:
    assert named in str(invalid_figure(item)), invalid_figure(item)


def test_counts_must_be_what_was_asked_and_a_sound_report_passes() -> None:
    assert invalid_figure(REPORT, runs=8, warmup=2) is None
    assert "runs is 8, but the check asked for 50" in str(invalid_figure(REPORT, runs=50))
    assert "warmup is 2, but the check asked for 5" in str(invalid_figure(REPORT, warmup=5))
    assert [expected_samples(n) for n in (1, 2000, 2001, 5000)] == [1, 2000, 1001, 1667]  # the runner thins by a whole step


def test_a_bad_report_carries_no_figure_and_fails_its_gate() -> None:
    lying: dict[str, Any] = {"runner_version": "2", "environment": {}, "reports": [_broken(p50=-1.0)], "error": None}
    (report,) = parse_runner_output(json.dumps(lying), device="pi", artifacts=["model.int8.tflite"], runs=8)
    assert report.error is not None and report.error["kind"] == "bad_report"
    assert report.latency_ms is None and report.latency_samples_ms == () and report.peak_rss_mb is None
    verdict = judge(Evidence(report), Limits(None))
    assert not verdict.passed and "could not run: bad_report" in verdict.failures[0]
    assert "latency_ms.p50 is -1.0" in verdict.failures[0]
