"""Silero VAD (tests/fixtures/silero.py): a trained, shipped ONNX model whose LSTMs sit inside ``If`` branches,
converted through the ONNX route for a profile.

Pinning its inputs makes onnxruntime's shape inference refuse a branch's LSTM ("First input tensor must have
rank 3"), although the source loads. The preparation must skip that one step, say so, and ship an fp32
that computes what the source does; nothing may blame the user's model or the fp32 file.

Every Conv and LSTM sits inside the ``If`` branches. Static INT8 is refused, and the refusal says why: static QDQ
never enters a branch. Dynamic INT8 enters them once the branches' weights (Constant nodes, the LSTMs' W and R built
by Slice/Concat/Unsqueeze) are folded into initializers: all of it int8 loses the speech decisions and is never
shipped as ok; the default profile's selective retry keeps the Convs float and ships the LSTMs int8, judged on the
streamed audio.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from tests.fixtures.silero import SileroVad, stream, voiced_audio
from toolkit.conversion.onnx.fold import fold_body_weights
from toolkit.conversion.pipeline import ConvertOptions, convert_bundle
from toolkit.model.artifact import ArtifactStatus
from toolkit.model.vocabulary import AttemptOutcome, Precision
from toolkit.runtimes.inspection.onnx import iter_graphs


def test_silero_vad_fp32_ships_verified_with_the_breaking_step_skipped_and_named(silero_vad: SileroVad,
                                                                               tmp_path: Path) -> None:
    result = convert_bundle(
        ConvertOptions(source=str(silero_vad.model), target="generic-x86_64", calibration=silero_vad.calibration,
                       eval_data=silero_vad.eval_data, formats=("onnx",), precisions=(Precision.FP32,
                       Precision.INT8, Precision.DYNAMIC), out=tmp_path / "bundle", use_cache=False),
        progress=lambda message: None,
    )
    fp32 = result.manifest.artifact("model.fp32.onnx")
    assert fp32 is not None and fp32.status is ArtifactStatus.OK, (fp32, result.manifest.attempts)
    check = fp32.verification
    assert check is not None and check.samples >= 90
    assert check.task == "recurrent" and check.task_metrics["sequence_state"] == "stateN -> state", check
    assert check.task_metrics["sequence_relative_error"] < 1e-5, check.task_metrics
    speech = next(o for o in check.outputs if o.name == "output")
    assert speech.metrics["decision_agreement"] == 1.0 and speech.max_error_ratio < 1e-5, speech
    # the step that breaks this model is skipped and named, with onnxruntime's reason; the others still run
    skipped = [n for n in fp32.notes if " skipped" in n]
    assert len(skipped) == 1 and skipped[0].startswith("pinning the input shapes skipped: this stage's transformed "
                                                       "model does not load in onnxruntime"), fp32.notes
    assert "rank 3" in skipped[0] and "(the source model does not)" in skipped[0], skipped
    assert any("unnamed nodes named" in n for n in fp32.notes), fp32.notes
    assert [s.shape for s in fp32.inputs] == [(None, None), (2, None, 128), ()]  # left as the source has them
    words = " ".join([*fp32.notes, *(a.reason for a in result.manifest.attempts)])
    assert "cannot load the fp32" not in words and "The source model" not in words, words
    # static INT8: nothing outside the branches to quantize, and the refusal says why
    refused = {a.recipe.precision: a.reason for a in result.manifest.attempts if a.recipe.precision != Precision.FP32}
    nested = "every operator it would quantize (12 Conv, 4 LSTM) sits inside an If/Loop/Scan body"
    assert nested in refused[Precision.INT8] and "static quantizer does not enter" in refused[Precision.INT8], refused
    # dynamic, asked for: every weight int8, inside the branches; it loses the speech decisions, so it ships marked
    # out of tolerance with the figures, never ok
    dynamic = result.manifest.artifact("model.dynamic.onnx")
    assert dynamic is not None and dynamic.status is ArtifactStatus.OUT_OF_TOLERANCE, refused
    assert dynamic.quantized is not None and dynamic.quantized.weights == 1.0, dynamic.quantized
    assert "decision agreement" in refused[Precision.DYNAMIC], refused
    lost = next(o for o in dynamic.verification.outputs if o.name == "output") if dynamic.verification else None
    assert lost is not None and lost.metrics["decision_agreement"] < 0.95, lost


def _agreement(model: Path, fp32: Path, audio: np.ndarray) -> tuple[float, float, int]:
    """Each model streamed over ``audio`` with its own state carried, as an application runs it: the share of
    chunks where both make the same speech decision (p > 0.5), that share over the chunks fp32 is sure of
    (p < 0.3 or p > 0.7), and how many chunks fp32 calls speech."""
    _, ours = stream(model, audio)
    _, theirs = stream(fp32, audio)
    same = (ours > 0.5) == (theirs > 0.5)
    sure = (theirs < 0.3) | (theirs > 0.7)
    return float(np.mean(same)), float(np.mean(same[sure])), int(np.sum(theirs > 0.5))


def test_silero_vad_dynamic_int8_quantizes_inside_the_branches_and_keeps_the_speech_decisions(
        silero_vad: SileroVad, tmp_path: Path) -> None:
    result = convert_bundle(
        ConvertOptions(source=str(silero_vad.model), target="generic-x86_64", calibration=silero_vad.calibration,
                       eval_data=silero_vad.eval_data, formats=("onnx",), out=tmp_path / "bundle", use_cache=False),
        progress=lambda message: None,
    )
    attempts = [(a.recipe.precision, a.outcome, a.reason) for a in result.manifest.attempts]
    # the profile's dynamic fallback is tried (static cannot reach the branches), not refused as "convolutional"
    assert not any("convolutional" in reason for *_, reason in attempts), attempts
    # all of it int8 loses the speech decisions: dropped with the figures
    full = [reason for precision, outcome, reason in attempts
            if precision == Precision.DYNAMIC and outcome is AttemptOutcome.DROPPED]
    assert len(full) == 1 and "decision agreement" in full[0] and "state fed back" in full[0], attempts
    fp32, dynamic = result.manifest.artifact("model.fp32.onnx"), result.manifest.artifact("model.dynamic.onnx")
    assert fp32 is not None and dynamic is not None, attempts
    assert dynamic.status in (ArtifactStatus.OK, ArtifactStatus.NO_SPEEDUP_MEASURED), (dynamic.status, attempts)
    assert any("Constant nodes turned into initializers" in n and "folded" in n for n in dynamic.notes), dynamic.notes
    # int8 in substance: the four LSTMs' weights are int8 initializers of the branches that run them
    share = dynamic.quantized
    assert share is not None and not share.mixed and 0.6 < share.weights < 0.7, share
    assert all(layer.op == "Conv" and layer.why.startswith("selective retry") for layer in share.float_layers), share
    folder = tmp_path / "bundle"
    model = onnx.load(str(folder / dynamic.file))
    lstms = [(graph, node) for graph in iter_graphs(model.graph) for node in graph.node
             if node.op_type in ("LSTM", "DynamicQuantizeLSTM")]
    assert [node.op_type for _, node in lstms] == ["DynamicQuantizeLSTM"] * 4, lstms
    for graph, node in lstms:
        weights = {init.name: init.data_type for init in graph.initializer}
        assert weights.get(node.input[1]) == weights.get(node.input[2]) == onnx.TensorProto.INT8, node
    assert all(graph is not model.graph for graph, _ in lstms)
    # judged on the task: the pipeline's figures, and the decisions of both streamed over audio never seen
    speech = next(o for o in dynamic.verification.outputs if o.name == "output") if dynamic.verification else None
    assert speech is not None and speech.metrics["decision_agreement"] >= 0.99, dynamic.verification
    assert dynamic.verification is not None
    assert dynamic.verification.task_metrics["sequence_relative_error"] < 0.15, dynamic.verification.task_metrics
    # 10 s never calibrated on, a third of its chunks ambiguous (fp32 p in 0.3-0.7): every sure decision is kept;
    # int8 reads about 0.05 lower, so some chunks just above 0.5 flip (21 of 312 when measured)
    agreement, sure, voiced = _agreement(folder / dynamic.file, folder / fp32.file, voiced_audio(10.0, seed=4))
    assert sure == 1.0 and agreement >= 0.9 and voiced > 100, (agreement, sure, voiced)
    # smaller than fp32 (its LSTM weights are a quarter of their float size; the Convs stay float)
    assert dynamic.bytes < 0.8 * fp32.bytes, (dynamic.bytes, fp32.bytes)


def test_folding_inside_the_branches_keeps_silero_exact(silero_vad: SileroVad, tmp_path: Path) -> None:
    model = onnx.load(str(silero_vad.model))
    moved, folded = fold_body_weights(model)
    assert moved > 300 and folded > 50, (moved, folded)
    bodies = [graph for graph in iter_graphs(model.graph)][1:]
    assert not any(node.op_type == "Constant" for graph in bodies for node in graph.node)
    for graph in bodies:  # each LSTM reads its W and R from its own graph's initializers
        own = {init.name for init in graph.initializer}
        assert all({n.input[1], n.input[2]} <= own for n in graph.node if n.op_type == "LSTM"), graph.name
    path = tmp_path / "folded.onnx"
    onnx.save(model, str(path))
    audio = voiced_audio(3.0, seed=2)
    _, want = stream(silero_vad.model, audio)
    _, got = stream(path, audio)
    assert np.array_equal(want, got), np.abs(want - got).max()
