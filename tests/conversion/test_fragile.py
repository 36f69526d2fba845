"""Known-fragile patterns kept float up front on the Keras -> TFLite route: the trained YOLO-style detector
(tests/fixtures/real_models.py), whose head's final Concat mixes box coordinates (0-320) and class scores (0-1).

Plain INT8 (the rule switched off through ``tflite._has_output_concat``, the route's one switch into it) gives
that tensor one int8 scale and the scores collapse; with the rule the Concat, the pass-through ops after it and
the head's Sigmoid/box decoding behind it stay float, and the output the Concat writes stays float32 although
the profile asks for int8 I/O: recorded in the artifact's ``float_io`` (reason ``mixed_ranges``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.real_models import Detector
from toolkit import api
from toolkit.conversion import tflite


def _int8_record(detector: Detector, out: Path) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    api.convert(detector.model, calibration=detector.calibration, eval_data=detector.eval_data,
                precisions=["fp32", "int8"], formats=["tflite"], out=out, use_cache=False,
                progress=lambda message: None)
    seconds = time.perf_counter() - start
    manifest = json.loads((out / "manifest.json").read_text())
    (int8,) = [a for a in manifest["artifacts"] if a["precision"] == "int8"]
    return int8, seconds


@pytest.fixture(scope="module")
def detector_int8(yolo_detector: Detector, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("fragile")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tflite, "_has_output_concat", lambda model: False)  # the rule off: plain INT8
        plain, plain_s = _int8_record(yolo_detector, work / "plain")
    ruled, ruled_s = _int8_record(yolo_detector, work / "ruled")
    print(f"plain int8 {plain_s:.1f}s recall {plain['verification']['task_metrics']['recall']:.3f}; "
          f"with the rule {ruled_s:.1f}s recall {ruled['verification']['task_metrics']['recall']:.3f}")
    return {"plain": plain, "ruled": ruled}


def test_final_concat_rule_repairs_the_detector(detector_int8: dict[str, Any]) -> None:
    plain, ruled = detector_int8["plain"], detector_int8["ruled"]
    before = plain["verification"]["task_metrics"]
    after = ruled["verification"]["task_metrics"]
    assert before["layout"] == after["layout"] == "yolo"
    assert before["recall"] < 0.8 and plain["status"] == "out_of_tolerance", before
    assert after["recall"] >= 0.95 and after["precision"] >= 0.9, after
    assert ruled["status"] in ("ok", "slower"), (ruled["status"], ruled["notes"])
    assert plain["float_nodes"] == [] and plain["float_io"] == []


def test_rule_records_which_nodes_and_why(detector_int8: dict[str, Any]) -> None:
    ruled = detector_int8["ruled"]
    nodes = ruled["float_nodes"]
    assert nodes[0] == ruled["outputs"][0]["name"] or nodes[0].startswith("StatefulPartitionedCall"), nodes  # the Concat
    assert any(n.endswith("scores_1/Sigmoid") for n in nodes), nodes  # the scores' Sigmoid behind it
    notes = [n for n in ruled["notes"] if n.startswith("kept in float up front")]
    assert len(notes) == 1 and "final Concat" in notes[0] and "LOGISTIC" in notes[0], ruled["notes"]
    # the output the Concat writes stays float (one int8 scale would collapse it again); the input stays int8
    assert [i["dtype"] for i in ruled["inputs"]] == ["int8"]
    (output,) = ruled["outputs"]
    assert output["dtype"] == "float32"
    assert [(f["name"], f["role"], f["reason"]) for f in ruled["float_io"]] == [(output["name"], "output",
                                                                                  "mixed_ranges")]
