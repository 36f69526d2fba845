"""Raw detector heads judged by their decoded detections, on an anchor-free detector trained here
(tests/fixtures/head_models.py) in two layouts: YOLOX's raw ``[N, 4+1+C]`` (grid offsets, log sizes,
objectness, class scores) and YOLOv8's channels-first ``[4+C, N]``.

Each one's plain INT8 (TFLite; the [N, 5+C] head also ONNX) is kept on recall, precision and matched IoU
against the float model's detections under a profile whose whole-tensor cosine limit (0.9999) it breaks; a
copy of the INT8 artifact with one head column corrupted (a class score's weight scale negated, a box width's
scale x 1.5) is refused by the same metrics. The same head with logit scores is read as a dense map, refused
on cosine, and the reason names the declaration that reads it as a head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.head_models import STRIDE, HeadModel, anchor_free_4cn, anchor_free_n5c  # noqa: F401 - fixtures
from tests.fixtures.role_models import float_outputs, run_artifact
from toolkit import api
from toolkit.errors import UsageError
from toolkit.model.heads import BoxEncoding, HeadLayout, HeadSpec
from toolkit.model.roles import parse_output_tasks
from toolkit.model.tasks import TaskChoice
from toolkit.model.tolerance import Tolerance
from toolkit.verification import detection_head
from toolkit.verification.outputs import verify_outputs

STRICT = Tolerance(min_cosine=0.9999)
KEPT = ("ok", "slower", "no_speedup_measured")


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("profiles")
    (root / "strict.toml").write_text('extends = "generic-x86_64"\n[tolerance]\nmin_cosine = 0.9999\n')
    return root


def _bundle(model: HeadModel, out: Path, profiles: Path, formats: list[str]) -> dict[str, Any]:
    api.convert(model.model, out=out, target="strict", targets_dirs=[profiles], precisions=["fp32", "int8"],
                formats=formats, calibration=model.calibration, eval_data=model.eval, use_cache=False,
                progress=lambda message: None)
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def n5c_bundle(anchor_free_n5c: HeadModel, profiles: Path,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("n5c") / "bundle"
    return out, _bundle(anchor_free_n5c, out, profiles, ["tflite", "onnx"])


@pytest.fixture(scope="module")
def c4n_bundle(anchor_free_4cn: HeadModel, profiles: Path,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("4cn") / "bundle"
    return out, _bundle(anchor_free_4cn, out, profiles, ["tflite"])


def _int8(manifest: dict[str, Any], suffix: str) -> dict[str, Any]:
    return next(a for a in manifest["artifacts"] if a["precision"] == "int8" and a["file"].endswith(suffix))


def corrupt_column(artifact: Path, layer: str, channel: int, factor: float, out: Path) -> Path:
    """A copy of an INT8 artifact whose 1x1 head convolution ``layer`` has output ``channel``'s weight scale
    multiplied by ``factor``: that column of the head comes out scaled (negated for -1), the rest unchanged.
    TFLite: the per-channel scale of the int8 tensor ``.../<layer>_1/convolution``; ONNX (QDQ): the scale
    initializer of that weight's DequantizeLinear."""
    name = f"/{layer}_1/convolution"
    if artifact.suffix == ".tflite":
        from ai_edge_litert.tools import flatbuffer_utils

        model = flatbuffer_utils.read_model(str(artifact))
        hits = [t for t in model.subgraphs[0].tensors if (t.name.decode() if isinstance(t.name, bytes) else
                str(t.name)).endswith(name) and t.quantization is not None and t.quantization.scale is not None]
        assert len(hits) == 1, hits
        scales = list(hits[0].quantization.scale)
        scales[channel] *= factor
        hits[0].quantization.scale = scales
        flatbuffer_utils.write_model(model, str(out))
        return out
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(artifact))
    (init,) = [i for i in model.graph.initializer if i.name.endswith(f"{name}/ReadVariableOp:0_scale")]
    scales = numpy_helper.to_array(init).copy()
    scales[channel] *= np.float32(factor)
    init.CopyFrom(numpy_helper.from_array(scales, init.name))
    onnx.save(model, str(out))
    return out


def _outputs(model: HeadModel, bundle: Path, record: dict[str, Any]) -> tuple[list, list]:  # type: ignore[type-arg]
    return float_outputs(model.model, model.x_eval), run_artifact(bundle / record["file"], model.x_eval, record)


def test_the_float_detector_is_trained(anchor_free_n5c: HeadModel) -> None:
    """The float head, decoded as the toolkit decodes it, finds the drawn shapes (IoU 0.5, same class): the
    metrics below judge a real detector, not noise."""
    heads = np.concatenate([o[0] for o in float_outputs(anchor_free_n5c.model, anchor_free_n5c.x_eval)])
    head = detection_head.infer(heads)
    assert head is not None and (head.layout, head.boxes) == (HeadLayout.N_5C, BoxEncoding.GRID), head
    boxes, scores = detection_head.decode(heads, head)
    found = drawn = matched = 0
    for s, truth in enumerate(anchor_free_n5c.boxes):
        corners = np.concatenate([truth[:, 1:3] - truth[:, 3:5] / 2, truth[:, 1:3] + truth[:, 3:5] / 2], 1) / STRIDE
        dets = detection_head.detect(boxes[s], scores[s])
        matched += detection_head.match(detection_head.Detections(corners, truth[:, 0].astype(int),
                                                                  np.ones(len(truth))), dets)[0]
        found, drawn = found + len(dets.scores), drawn + len(truth)
    assert drawn >= 100 and matched / drawn >= 0.85 and matched / found >= 0.9, (matched, drawn, found)


@pytest.mark.parametrize("suffix", [".tflite", ".onnx"])
def test_n5c_head_int8_is_kept_on_its_detections_where_cosine_would_refuse(
        n5c_bundle: tuple[Path, dict[str, Any]], suffix: str) -> None:
    _, manifest = n5c_bundle
    record = _int8(manifest, suffix)
    v = record["verification"]
    (out,) = v["outputs"]
    assert out["role"] == "detection-head" and out["role_source"].startswith("inferred: a raw detector head"), out
    assert "objectness" in out["role_source"] and "raw grid offsets and log sizes" in out["role_source"], out
    assert v["task"] == "detection" and "raw detector head" in v["task_source"], v["task_source"]
    m = out["metrics"]
    assert (m["layout"], m["boxes"], m["classes"], m["grid"]) == ("n_5c", "grid", 2, "12x12"), m
    assert m["float_detections"] >= 100 and m["recall"] >= 0.9 and m["precision"] >= 0.9, m
    assert m["mean_iou"] >= Tolerance().min_detection_iou, m
    print(f"n5c {suffix}: cosine {v['cosine_similarity']:.6f}", {k: m[k] for k in ("recall", "precision", "mean_iou")})
    assert v["cosine_similarity"] < STRICT.min_cosine  # the profile's tensor limit alone would drop it
    assert record["status"] in KEPT, (record["status"], record.get("notes"))


def test_4cn_head_int8_is_kept_on_its_detections_where_cosine_would_refuse(
        c4n_bundle: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = c4n_bundle
    record = _int8(manifest, ".tflite")
    v = record["verification"]
    (out,) = v["outputs"]
    assert out["role"] == "detection-head" and "(4c_n:" in out["role_source"], out
    m = out["metrics"]
    assert (m["layout"], m["boxes"], m["classes"]) == ("4c_n", "grid", 2), m
    assert m["float_detections"] >= 100 and m["recall"] >= 0.9 and m["precision"] >= 0.9, m
    print(f"4cn: cosine {v['cosine_similarity']:.6f}", {k: m[k] for k in ("recall", "precision", "mean_iou")})
    assert v["cosine_similarity"] < STRICT.min_cosine
    assert record["status"] in KEPT, (record["status"], record.get("notes"))


BREAKS = {"class-score-negated": ("cls", 1, -1.0), "box-width-x1.5": ("box", 2, 1.5)}


@pytest.mark.parametrize("plant", sorted(BREAKS))
@pytest.mark.parametrize("layout,suffix", [("n5c", ".tflite"), ("n5c", ".onnx"), ("4cn", ".tflite")])
def test_a_corrupted_head_column_is_refused(
        layout: str, suffix: str, plant: str, anchor_free_n5c: HeadModel, anchor_free_4cn: HeadModel,
        n5c_bundle: tuple[Path, dict[str, Any]], c4n_bundle: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    model, (bundle, manifest) = (anchor_free_n5c, n5c_bundle) if layout == "n5c" else (anchor_free_4cn, c4n_bundle)
    record = _int8(manifest, suffix)
    broken = corrupt_column(bundle / record["file"], *BREAKS[plant], tmp_path / f"broken{suffix}")
    reference = float_outputs(model.model, model.x_eval)
    verdict = verify_outputs(reference, run_artifact(broken, model.x_eval, record), tolerance=STRICT,
                             output_names=["head"])
    (out,) = verdict.verification.outputs
    print(layout, suffix, plant, {k: out.metrics[k] for k in ("recall", "precision", "mean_iou")},
          f"cosine {out.cosine_similarity:.4f}")
    assert out.role == "detection-head" and not verdict.ok
    assert any(f.startswith("head (detection-head): ") for f in verdict.failures), verdict.failures


def test_declared_and_task_given_heads(anchor_free_n5c: HeadModel, n5c_bundle: tuple[Path, dict[str, Any]]) -> None:
    """Declared (--output-task head=detection-head,layout=n_5c,boxes=grid) or under --task detection, the head
    is read the same way; the declaration is recorded as the role's source."""
    bundle, manifest = n5c_bundle
    reference, artifact = _outputs(anchor_free_n5c, bundle, _int8(manifest, ".tflite"))
    declared = parse_output_tasks(["head=detection-head,layout=n_5c,boxes=grid"])
    verdict = verify_outputs(reference, artifact, tolerance=STRICT, output_names=["head"],
                             task=TaskChoice(None, "--output-task", declared))
    (out,) = verdict.verification.outputs
    assert out.role_source == "--output-task" and out.metrics["layout"] == "n_5c" and verdict.ok, verdict.failures
    assert verdict.verification.task == "detection"
    given = verify_outputs(reference, artifact, tolerance=STRICT, output_names=["head"], task="detection")
    (out,) = given.verification.outputs
    assert out.role == "detection-head" and given.ok, given.failures


def _as_logits(per_sample: list) -> list:  # type: ignore[type-arg]
    """The head with its score columns written as logits (a head exported without its sigmoid)."""
    def one(head: np.ndarray) -> np.ndarray:
        p = np.clip(head[..., 4:].astype(np.float64), 1e-6, 1 - 1e-6)
        return np.concatenate([head[..., :4], np.log(p / (1 - p))], axis=-1).astype(np.float32)
    return [[one(outs[0])] for outs in per_sample]


def test_a_logit_head_read_as_a_map_names_the_role_that_passes(
        anchor_free_n5c: HeadModel, n5c_bundle: tuple[Path, dict[str, Any]]) -> None:
    """Logit scores are not claimed as a head on their own (any unbounded map could be read so): the head is
    read as a dense map, where the INT8's background logits break cosine and relative error; the reason says
    it passes as a detection head and what to declare. Declared so, or under --task detection, it passes."""
    bundle, manifest = n5c_bundle
    reference, artifact = (_as_logits(o) for o in _outputs(anchor_free_n5c, bundle, _int8(manifest, ".tflite")))
    plain = verify_outputs(reference, artifact, tolerance=Tolerance(), output_names=["head"])
    (out,) = plain.verification.outputs
    print("logit head read as a map:", plain.failures)
    assert out.role == "dense" and out.metrics["would_pass_as"] == "detection-head", out
    assert plain.verification.cosine_similarity < Tolerance().min_cosine
    declare = "head=detection-head,layout=n_5c,boxes=grid"
    assert any(f.startswith("cosine similarity") and f"declare --output-task {declare}" in f
               for f in plain.failures), plain.failures
    declared = verify_outputs(reference, artifact, tolerance=Tolerance(), output_names=["head"],
                              task=TaskChoice(None, "--output-task", parse_output_tasks([declare])))
    assert declared.ok and declared.verification.outputs[0].metrics["scores"] == "logits (sigmoid)", declared.failures
    given = verify_outputs(reference, artifact, tolerance=Tolerance(), output_names=["head"], task="detection")
    (out,) = given.verification.outputs
    assert out.role == "detection-head" and out.role_source.startswith("inferred under --task: "), out.role_source
    assert "scores are logits" in out.role_source and out.metrics["float_detections"] >= 100, out
    assert given.ok, given.failures


def _decoded(per_sample: list) -> list:  # type: ignore[type-arg]
    """The head as YOLOv5 exports it: boxes decoded to cx, cy, w, h in pixels, objectness and classes kept."""
    heads = np.concatenate([outs[0] for outs in per_sample])
    head = detection_head.infer(heads, spec=HeadSpec(HeadLayout.N_5C, BoxEncoding.GRID))
    assert head is not None
    cells = detection_head.decode(heads, head)[0] * STRIDE
    boxes = np.concatenate([(cells[..., :2] + cells[..., 2:]) / 2, cells[..., 2:] - cells[..., :2]], axis=-1)
    decoded = np.concatenate([boxes, heads[..., 4:]], axis=-1).astype(np.float32)
    return [[decoded[i:i + 1]] for i in range(len(decoded))]


def test_a_decoded_head_with_objectness_is_no_yolov8_head(
        anchor_free_n5c: HeadModel, n5c_bundle: tuple[Path, dict[str, Any]]) -> None:
    """YOLOv5's decoded [N, 5+C] (boxes in pixels) also reads as [N, 4+C] with scores in [0, 1] after the
    boxes; its column 4 fires with a class, so it is objectness: the head is n_5c, boxes centre and size."""
    bundle, manifest = n5c_bundle
    reference, artifact = (_decoded(o) for o in _outputs(anchor_free_n5c, bundle, _int8(manifest, ".tflite")))
    verdict = verify_outputs(reference, artifact, tolerance=Tolerance(), output_names=["head"])
    (out,) = verdict.verification.outputs
    assert out.role == "detection-head" and verdict.verification.task == "detection", out.role_source
    assert (out.metrics["layout"], out.metrics["boxes"]) == ("n_5c", "cxcywh"), out.role_source
    assert "follows the anchor's grid row" in out.role_source and "layout" not in verdict.verification.task_metrics
    assert out.metrics["float_detections"] >= 100 and verdict.ok, (out.metrics, verdict.failures)


def test_grid_levels_and_multi_level_decoding() -> None:
    """8400 anchors are YOLOX's 80x80 + 40x40 + 20x20 cells at 640 (strides 8, 16, 32 = 1, 2, 4 cells of the
    finest); a raw offset (0.5, 0.5) and log size 0 at level 2's first cell decodes to a box of 4 cells there."""
    assert detection_head.grid_levels(8400) == ((80, 80), (40, 40), (20, 20))
    assert detection_head.grid_levels(144) == ((12, 12),)
    assert detection_head.grid_levels(150) == ()
    head = detection_head.Head(HeadLayout.N_4C, BoxEncoding.GRID, False, 1, ((4, 4), (2, 2), (1, 1)), "test")
    rows = np.zeros((1, 21, 5))
    rows[0, 20] = [0.5, 0.5, 0.0, 0.0, 0.9]
    boxes, scores = detection_head.decode(rows, head)
    assert boxes[0, 20].tolist() == [0.0, 0.0, 4.0, 4.0] and scores[0, 20, 0] == 0.9


def test_head_declarations_parse() -> None:
    (head,) = parse_output_tasks(["head=detection-head,layout=4c_n"])
    assert head.head is not None and (head.head.layout, head.head.boxes) == (HeadLayout.C4_N, None)
    for bad, words in (("head=detection-head,layout=n5c", "layout='n5c'"),
                       ("head=detection-head,boxes=xywh", "boxes='xywh'"),
                       ("head=dense,layout=n_5c", "describe a raw detector head")):
        with pytest.raises(UsageError) as raised:
            parse_output_tasks([bad])
        assert words in raised.value.message, raised.value.message
