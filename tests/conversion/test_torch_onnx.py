"""PyTorch -> ONNX (torch.onnx.export, current exporter with the legacy one as a named fallback), then the shared
quantization: every artifact run in onnxruntime through ``open_session`` against eager PyTorch outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.torch_models import TorchModel
from toolkit.conversion.base import BuiltArtifact, ConversionRequest
from toolkit.errors import ConversionError, UsageError
from toolkit.runtimes.execution import open_session
from toolkit.sources.base import SourceModel
from toolkit.sources.detect import open_source
from toolkit.model.recipe import Recipe


def _request(
    source: SourceModel,
    model: TorchModel,
    workdir: Path,
    *,
    precision: str = "fp32",
    max_opset: int | None = None,
    dynamic_batch: bool = False,
    calibration: int = 100,
    **recipe: object,
) -> ConversionRequest:
    return ConversionRequest(
        source=source,
        recipe=Recipe(format="onnx", precision=precision, **recipe),  # type: ignore[arg-type]
        input_shapes={model.input_name: model.input_shape},
        calibration=model.calibration(calibration),
        workdir=workdir,
        max_opset=max_opset,
        dynamic_batch=dynamic_batch,
    )


def _export(source: SourceModel, model: TorchModel, tmp_path: Path, **kw: object) -> BuiltArtifact:
    from toolkit.conversion.onnx import from_torch as torch_onnx

    return torch_onnx.export(_request(source, model, tmp_path, **kw), tmp_path / "export.fp32.onnx")  # type: ignore[arg-type]


def _run_each(path: Path, name: str, x: np.ndarray) -> np.ndarray:
    session = open_session(path, threads=1)
    return np.concatenate([session.run({name: x[i : i + 1]})[0] for i in range(len(x))])


def _opset(path: Path) -> int:
    import onnx

    return max(o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx"))


@pytest.fixture(scope="module")
def digits_source(torch_digits_net: TorchModel) -> SourceModel:
    return open_source(torch_digits_net.factory, weights=torch_digits_net.weights)


@pytest.fixture(scope="module")
def digits_reference(digits_source: SourceModel, torch_digits_net: TorchModel) -> np.ndarray:
    return digits_source.predict({"image": torch_digits_net.x_heldout})[0]


def test_conv_net_fp32_is_exact_single_file_opset_18(
    digits_source: SourceModel, digits_reference: np.ndarray, torch_digits_net: TorchModel, tmp_path: Path
) -> None:
    built = _export(digits_source, torch_digits_net, tmp_path)
    assert built.exporter and "dynamo exporter, opset 18" in built.exporter
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.fp32.onnx"]  # no .data file beside it
    assert _opset(built.path) == 18
    session = open_session(built.path)
    assert [(s.name, s.shape) for s in session.inputs] == [("image", (1, 1, 8, 8))]
    assert [s.name for s in session.outputs] == ["output"]
    got = _run_each(built.path, "image", torch_digits_net.x_heldout)
    assert float(np.abs(got - digits_reference).max()) < 1e-4


def test_dynamic_batch_runs_the_whole_heldout_set_at_once(
    digits_source: SourceModel, digits_reference: np.ndarray, torch_digits_net: TorchModel, tmp_path: Path
) -> None:
    built = _export(digits_source, torch_digits_net, tmp_path, dynamic_batch=True)
    session = open_session(built.path)
    assert session.inputs[0].shape[0] is None or isinstance(session.inputs[0].shape[0], str)
    got = session.run({"image": torch_digits_net.x_heldout})[0]
    assert got.shape == (497, 10)
    assert float(np.abs(got - digits_reference).max()) < 1e-4


def test_int8_static_qdq_within_one_point_of_float(
    digits_source: SourceModel, digits_reference: np.ndarray, torch_digits_net: TorchModel, tmp_path: Path
) -> None:
    from toolkit.conversion.onnx import quant as onnx_quant

    base = _export(digits_source, torch_digits_net, tmp_path)
    request = _request(digits_source, torch_digits_net, tmp_path, precision="int8")
    built = onnx_quant.derive(request, base, tmp_path / "model.int8.onnx")
    got = _run_each(built.path, "image", torch_digits_net.x_heldout)
    accuracy = float((got.argmax(axis=1) == torch_digits_net.y_heldout).mean())
    assert accuracy >= torch_digits_net.float_accuracy - 0.01, (accuracy, torch_digits_net.float_accuracy)
    assert float((got.argmax(axis=1) == digits_reference.argmax(axis=1)).mean()) >= 0.98
    assert built.path.stat().st_size < 0.4 * base.path.stat().st_size


def test_opset_17_target_falls_back_to_the_legacy_exporter_and_says_so(
    torch_digits_encoder: TorchModel, tmp_path: Path
) -> None:
    """The transformer's graph cannot be down-converted from 18 (findings.md): the legacy exporter writes 17."""
    source = open_source(torch_digits_encoder.factory, weights=torch_digits_encoder.weights)
    built = _export(source, torch_digits_encoder, tmp_path, max_opset=17)
    assert built.exporter and "legacy TorchScript exporter, opset 17" in built.exporter
    assert any("Legacy TorchScript exporter used" in n and "opset 17" in n for n in built.notes), built.notes
    assert _opset(built.path) == 17
    x = torch_digits_encoder.x_heldout[:64]
    assert (
        float(np.abs(_run_each(built.path, "sequence", x) - source.predict({"sequence": x})[0]).max()) < 1e-4
    )


def test_opset_17_target_stays_with_the_current_exporter_when_it_can(
    digits_source: SourceModel, torch_digits_net: TorchModel, tmp_path: Path
) -> None:
    built = _export(digits_source, torch_digits_net, tmp_path, max_opset=17)
    assert built.exporter and "dynamo exporter, opset 17" in built.exporter
    assert _opset(built.path) == 17


def test_gru_fp32(torch_digits_gru: TorchModel, tmp_path: Path) -> None:
    source = open_source(torch_digits_gru.factory, weights=torch_digits_gru.weights)
    built = _export(source, torch_digits_gru, tmp_path)
    x = torch_digits_gru.x_heldout
    got = _run_each(built.path, "sequence", x)
    assert float(np.abs(got - source.predict({"sequence": x})[0]).max()) < 1e-4


def test_transformer_fp32_and_dynamic_int8(torch_digits_encoder: TorchModel, tmp_path: Path) -> None:
    from toolkit.conversion.onnx import quant as onnx_quant

    source = open_source(torch_digits_encoder.factory, weights=torch_digits_encoder.weights)
    base = _export(source, torch_digits_encoder, tmp_path)
    x, y = torch_digits_encoder.x_heldout, torch_digits_encoder.y_heldout
    reference = source.predict({"sequence": x})[0]
    assert float(np.abs(_run_each(base.path, "sequence", x) - reference).max()) < 1e-4
    request = _request(source, torch_digits_encoder, tmp_path, precision="dynamic")
    dynamic = onnx_quant.derive(request, base, tmp_path / "model.dynamic.onnx")
    got = _run_each(dynamic.path, "sequence", x)
    accuracy = float((got.argmax(axis=1) == y).mean())
    assert accuracy >= torch_digits_encoder.float_accuracy - 0.02, (
        accuracy,
        torch_digits_encoder.float_accuracy,
    )
    assert dynamic.path.stat().st_size < base.path.stat().st_size


def test_torchscript_goes_through_the_legacy_exporter_named(
    torch_digits_net: TorchModel, digits_reference: np.ndarray, tmp_path: Path
) -> None:
    import torch

    from tests.sources.test_torch_source import _eager

    path = tmp_path / "digits.pt"
    torch.jit.save(torch.jit.script(_eager(torch_digits_net)), str(path))
    source = open_source(str(path))
    built = _export(source, torch_digits_net, tmp_path / "out")
    assert built.exporter and "legacy TorchScript exporter" in built.exporter
    assert any("TorchScript source" in n for n in built.notes)
    got = _run_each(built.path, "image", torch_digits_net.x_heldout)
    assert float(np.abs(got - digits_reference).max()) < 1e-4


def test_exported_program_to_onnx(
    torch_digits_net: TorchModel, digits_reference: np.ndarray, tmp_path: Path
) -> None:
    import torch

    from tests.sources.test_torch_source import _eager

    path = tmp_path / "digits.pt2"
    torch.export.save(torch.export.export(_eager(torch_digits_net), (torch.zeros(1, 1, 8, 8),)), str(path))
    source = open_source(str(path))
    built = _export(source, torch_digits_net, tmp_path / "out")
    assert built.exporter and "dynamo exporter" in built.exporter
    got = _run_each(built.path, "image", torch_digits_net.x_heldout)
    assert float(np.abs(got - digits_reference).max()) < 1e-4


def test_an_op_no_exporter_handles_is_named(torch_digits_net: TorchModel, tmp_path: Path) -> None:
    source = open_source(torch_digits_net.factory.replace("make_digits_net", "make_eigen"))
    request = ConversionRequest(
        source=source,
        recipe=Recipe(format="onnx", precision="fp32"),
        input_shapes={"matrix": (1, 4, 4)},
        calibration=(),
        workdir=tmp_path,
    )
    from toolkit.conversion.onnx import from_torch as torch_onnx

    with pytest.raises(ConversionError) as info:
        torch_onnx.export(request, tmp_path / "eigen.onnx")
    assert "aten::linalg_eig" in info.value.message
    assert "Replace aten::linalg_eig" in (info.value.hint or "")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_missing_input_shape_is_a_usage_error(torch_digits_net: TorchModel, tmp_path: Path) -> None:
    from toolkit.conversion.onnx import from_torch as torch_onnx

    source = open_source(torch_digits_net.factory.replace("make_digits_net", "make_digits_net_bare"))
    request = ConversionRequest(
        source=source,
        recipe=Recipe(format="onnx", precision="fp32"),
        input_shapes={},
        calibration=(),
        workdir=tmp_path,
    )
    with pytest.raises(UsageError) as info:
        torch_onnx.export(request, tmp_path / "x.onnx")
    assert "--input-shape image=" in str(info.value)
