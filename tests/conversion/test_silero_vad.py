"""Silero VAD (tests/fixtures/silero.py): a trained, shipped ONNX model whose LSTMs sit inside ``If`` branches,
converted through the ONNX route for a profile.

Pinning its inputs makes onnxruntime's shape inference refuse a branch's LSTM ("First input tensor must have
rank 3"), although the source loads. The preparation must skip that one step, say so, and ship an fp32
that computes what the source does; nothing may blame the user's model or the fp32 file.

Every Conv and LSTM sits inside the ``If`` branches, so INT8 is refused, and the refusal says why: static QDQ never
enters a branch; dynamic enters them but finds the branches' weights in Constant nodes, not initializers.
"""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.silero import SileroVad
from toolkit.conversion.pipeline import ConvertOptions, convert_bundle
from toolkit.model.artifact import ArtifactStatus
from toolkit.model.vocabulary import Precision


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
    # no INT8 artifact: nothing outside the branches to quantize, and each refusal says why
    refused = {a.recipe.precision: a.reason for a in result.manifest.attempts if a.recipe.precision != Precision.FP32}
    assert [a.file for a in result.manifest.artifacts] == ["model.fp32.onnx"], refused
    nested = "every operator it would quantize (12 Conv, 4 LSTM) sits inside an If/Loop/Scan body"
    assert nested in refused[Precision.INT8] and "static quantizer does not enter" in refused[Precision.INT8], refused
    assert nested in refused[Precision.DYNAMIC] and "to be an initializer" in refused[Precision.DYNAMIC], refused
