"""Known-fragile patterns kept float up front on the PyTorch -> TFLite route (litert-torch PT2E): the trained
PyTorch YOLO-style detector (tests/fixtures/torch_detector.py), whose head's final ``torch.cat`` joins box
coordinates (0-320) and class scores (0-1).

Plain PT2E INT8 (the rule switched off through ``pt2e._has_output_cat``, the route's one switch into it) gives
that tensor one int8 scale and the scores collapse; with the rule the cat, the pass-through ops after it and
the head's sigmoids/box decoding behind it stay float, and the output the cat writes stays float32 although
the profile asks for int8 I/O: recorded in the artifact's ``float_io`` (reason ``mixed_ranges``).

Needs the ``litert-torch`` extra (CI installs it through ``[all]``); skipped with that reason without it.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.real_models import assert_detects_drawn_shapes, assert_rule_repairs
from tests.fixtures.torch_detector import TorchDetector, torch_yolo_detector  # noqa: F401 (fixture)
from toolkit import api

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("litert_torch") is None,
    reason="litert-torch is not installed: pip install -e '.[litert-torch]' (CI gets it through '.[all]')",
)


def _int8_record(detector: TorchDetector, out: Path) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    api.convert(detector.factory, weights=detector.weights, calibration=detector.calibration,
                eval_data=detector.eval_data, precisions=["int8"], formats=["tflite"], out=out, use_cache=False,
                progress=lambda message: None)
    seconds = time.perf_counter() - start
    manifest = json.loads((out / "manifest.json").read_text())
    for attempt in manifest["attempts"]:
        print(f"  {out.name}: {attempt['recipe']['precision']} {attempt['recipe']['nodes_to_exclude']} "
              f"{attempt['outcome']}: {attempt['reason'][:160]}")
    (int8,) = [a for a in manifest["artifacts"] if a["precision"] == "int8"]
    return int8, seconds


@pytest.fixture(scope="module")
def detector_int8(torch_yolo_detector: TorchDetector,  # noqa: F811 (the fixture imported above)
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from toolkit.conversion.pt2e import quantize as pt2e

    work = tmp_path_factory.mktemp("torch-fragile")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pt2e, "_has_output_cat", lambda graph: False)  # the rule off: plain PT2E INT8
        plain, plain_s = _int8_record(torch_yolo_detector, work / "plain")
    ruled, ruled_s = _int8_record(torch_yolo_detector, work / "ruled")
    trained = f"trained in {torch_yolo_detector.train_seconds:.1f}s" if torch_yolo_detector.train_seconds else "cached"
    print(f"torch detector ({trained}): plain int8 {plain_s:.1f}s recall "
          f"{plain['verification']['task_metrics']['recall']:.3f}; with the rule {ruled_s:.1f}s recall "
          f"{ruled['verification']['task_metrics']['recall']:.3f} precision "
          f"{ruled['verification']['task_metrics']['precision']:.3f}")
    return {"plain": plain, "ruled": ruled}


def test_the_float_torch_detector_is_trained(torch_yolo_detector: TorchDetector) -> None:  # noqa: F811
    """Recall and precision of the float model against the drawn shapes (IoU 0.5, score > 0.25): the metric
    below judges a real detector, not noise."""
    from toolkit.sources.detect import open_source

    source = open_source(torch_yolo_detector.factory, weights=torch_yolo_detector.weights)
    heads = source.predict({"image": np.load(torch_yolo_detector.eval_data)["image"]})[0]
    recall, precision = assert_detects_drawn_shapes(heads, torch_yolo_detector.eval_boxes)
    print(f"float torch detector: recall {recall:.3f}, precision {precision:.3f}")


def test_final_cat_rule_repairs_the_torch_detector(detector_int8: dict[str, Any]) -> None:
    assert_rule_repairs(detector_int8["plain"], detector_int8["ruled"])


def test_rule_records_which_nodes_and_why(detector_int8: dict[str, Any]) -> None:
    ruled = detector_int8["ruled"]
    nodes = ruled["float_nodes"]
    assert nodes[0] == "cat_2", nodes  # the final cat (the FX node name, as nodes_to_exclude takes it)
    # the head behind it: the sigmoids, the box decoding, the inner cat of centres and sizes, the split
    assert {"sigmoid", "sigmoid_1", "sigmoid_2", "mul", "add", "mul_1", "cat_1", "slice_2"} <= set(nodes), nodes
    assert not any(n.startswith("conv2d") for n in nodes), nodes  # the convolutions stay int8
    notes = [n for n in ruled["notes"] if n.startswith("kept in float up front")]
    assert len(notes) == 1 and "final Concat 'cat_2'" in notes[0] and "sigmoid" in notes[0], ruled["notes"]
    assert any("activation ranges of the full calibration reused" in n for n in ruled["notes"]), ruled["notes"]
    # the output the cat writes stays float (one int8 scale would collapse it again); the input stays int8
    assert [i["dtype"] for i in ruled["inputs"]] == ["int8"]
    (output,) = ruled["outputs"]
    assert output["dtype"] == "float32"
    assert [(f["name"], f["role"], f["reason"]) for f in ruled["float_io"]] == [(output["name"], "output",
                                                                                  "mixed_ranges")]


def test_selective_rebuild_keeps_the_fragile_nodes_float(torch_yolo_detector: TorchDetector,  # noqa: F811
                                                         tmp_path: Path) -> None:
    """A selective rebuild (nodes_to_exclude from the layer table) keeps the fragile nodes float as well and
    reuses the full calibration's ranges; its own layers are listed apart from them."""
    import dataclasses

    from toolkit.conversion.pt2e import layers as pt2e_layers
    from toolkit.conversion.pt2e import litert as torch_tflite
    from toolkit.conversion.base import ConversionRequest
    from toolkit.sources.detect import open_source
    from toolkit.model.recipe import Recipe

    source = open_source(torch_yolo_detector.factory, weights=torch_yolo_detector.weights)
    calibration = np.load(torch_yolo_detector.calibration)["image"][:32]
    request = ConversionRequest(source=source, recipe=Recipe(format="tflite", precision="int8", io_dtype="int8"),
                                input_shapes={"image": (1, 3, 64, 64)},
                                calibration=tuple({"image": x[None]} for x in calibration), workdir=tmp_path)
    rows, _samples = pt2e_layers.layer_rows(request)  # the full quantization's table: calibrates once, cached
    assert "conv2d_7" in {row[0] for row in rows}, [row[0] for row in rows]  # the score convolution
    mixed = dataclasses.replace(request, recipe=dataclasses.replace(request.recipe, nodes_to_exclude=("conv2d_7",)))
    built = torch_tflite.convert(mixed, tmp_path / "mixed.tflite")
    assert built.float_nodes[0] == "conv2d_7" and "cat_2" in built.float_nodes and "sigmoid_2" in built.float_nodes
    assert "kept in float: conv2d_7" in built.notes, built.notes
    assert any(n.startswith("kept in float up front") for n in built.notes), built.notes
    assert any("activation ranges of the full calibration reused" in n for n in built.notes), built.notes
    assert [(f.name, f.reason) for f in built.float_io] == [("output_0", "mixed_ranges")]
