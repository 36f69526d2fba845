"""INT8 on models with integer inputs: token ids stay int64 from the calibration data to the golden data.

The token classifier is trained (tests/fixtures/token_models.py), so agreement with the float model is a
real claim about this small model, not about transformers in general.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.token_models import TokenModel, token_net  # noqa: F401 (fixture)
from toolkit.bundle import GOLDEN_INPUTS, load_npz, read_bundle
from toolkit.inspection import inspect_model
from toolkit.pipeline import ConvertOptions, ConvertResult, convert_bundle


def _convert(source: str, model: TokenModel, out, **options) -> ConvertResult:
    return convert_bundle(
        ConvertOptions(source=source, calibration=model.calibration, eval_data=model.eval_data, out=out,
                       use_cache=False, **options),
        progress=print,
    )


def test_onnx_static_int8_with_int64_tokens(token_net: TokenModel, tmp_path) -> None:
    result = _convert(str(token_net.onnx), token_net, tmp_path / "b")
    manifest = result.manifest
    for a in manifest.attempts:
        print(a.outcome, a.recipe["format"], a.recipe["precision"], a.reason[:300])
    for art in manifest.artifacts:
        print(art.file, art.status, art.verification, [(s.name, s.dtype) for s in art.inputs])
    int8 = manifest.artifact("model.int8.onnx")
    assert [(s.name, s.dtype) for s in int8.inputs] == [("tokens", "int64")]
    assert inspect_model(result.bundle_dir / int8.file).quantized_ops > 0
    golden = load_npz(result.bundle_dir / GOLDEN_INPUTS)
    assert all(v.dtype == np.int64 for v in golden.values())
    assert int8.verification is not None and int8.verification.top1_agreement is not None
    assert int8.verification.top1_agreement >= 0.97
    read_bundle(result.bundle_dir)
