"""The ExecuTorch tests' shared bundle: the trained digits CNN converted once per session to .pte and .onnx
(fp32 and INT8), verified on the held-out digits with their labels."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.torch_models import TorchModel
from toolkit import api

needs_executorch = pytest.mark.skipif(
    importlib.util.find_spec("executorch") is None,
    reason="executorch is not installed: pip install -e '.[executorch]' (CI gets it through '.[all]')",
)


def convert_pte(model: TorchModel, out: Path, precisions: list[str], formats: tuple[str, ...] = ("pte",)
                ) -> dict[str, Any]:
    """``model`` converted to .pte at ``precisions`` (eval = the held-out digits with labels); the manifest."""
    data = out.parent / f"{out.name}-eval.npz"
    np.savez(data, **{model.input_name: model.x_heldout, "y": model.y_heldout})
    calib = out.parent / f"{out.name}-calib.npz"
    np.savez(calib, **{model.input_name: model.x_calib[:100]})
    api.convert(model.factory, weights=model.weights, calibration=calib, eval_data=data, precisions=precisions,
                formats=list(formats), out=out, use_cache=False, progress=lambda message: None)
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="session")
def pte_digits_bundle(torch_digits_net: TorchModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("pte") / "digits"
    return out, convert_pte(torch_digits_net, out, ["fp32", "int8"], ("onnx", "pte"))
