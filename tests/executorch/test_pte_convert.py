"""PyTorch -> ExecuTorch (.pte, XNNPACK): the trained digits CNN and the trained transformer encoder converted at
fp32, fp16 and INT8 through the whole convert stage (``api.convert``), each artifact verified against eager PyTorch
and the held-out labels, the delegated share and the bundled program in the manifest, and the bundled program
checked by ExecuTorch's own verifier (right and wrong expectations). Needs the ``executorch`` extra."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.device_envs import DeviceEnv
from tests.fixtures.pte import convert_pte, needs_executorch, shipped_pte_floor
from tests.fixtures.torch_models import TorchModel
from toolkit import api
from toolkit.errors import UsageError

pytestmark = needs_executorch


def _artifact(manifest: dict[str, Any], precision: str) -> dict[str, Any]:
    (record,) = [a for a in manifest["artifacts"] if a["precision"] == precision and a["format"] == "pte"]
    return record


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_digits_pte_verified_against_eager_and_labels(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                                      torch_digits_net: TorchModel, precision: str) -> None:
    out, manifest = pte_digits_bundle
    record = _artifact(manifest, precision)
    assert record["file"] == f"model.{precision}.pte" and record["format"] == "pte"
    assert record["runtime"] == "executorch" and record["status"] in ("ok", "slower", "no_speedup_measured")
    verification = record["verification"]
    assert verification["accuracy"] >= torch_digits_net.float_accuracy - (0.0 if precision == "fp32" else 0.02)
    assert verification["top1_agreement"] >= (1.0 if precision == "fp32" else 0.97)
    if precision == "fp32":
        assert verification["max_abs_error"] < 1e-4
    pte = record["pte"]
    print(f"digits {precision}: accuracy {verification['accuracy']:.3f}, XNNPACK {pte['delegated_nodes']} of "
          f"{pte['total_nodes']} nodes; notes: {record['notes']}")
    assert pte["total_nodes"] > 0 and pte["delegated_share"] >= 0.8  # the CNN's compute is all XNNPACK's
    assert (out / pte["bundled"]).is_file() and pte["bundled_atol"] > 0
    assert (out / record["file"]).read_bytes()[4:8] == b"ET12"  # a plain program any ExecuTorch runner loads


def test_digits_pte_fp16(torch_digits_net: TorchModel, executorch_env: DeviceEnv, tmp_path: Path) -> None:
    """fp16: a half copy of the trained CNN behind float32 I/O, verified against eager fp32 PyTorch with the
    default tolerance (the fp32 artifact's own limits), labelled fp16 by inspection (its weights are float16, not a
    float32 program under an fp16 name), its bundled program passing, and measured by the device's runner."""
    from tests.runner.test_runner import check, reports
    from toolkit.runtimes.inspection import inspect_model

    out = tmp_path / "digits"
    manifest = convert_pte(torch_digits_net, out, ["fp16"])
    record = _artifact(manifest, "fp16")
    assert record["status"] in ("ok", "slower", "no_speedup_measured"), record
    verification = record["verification"]
    print(f"digits fp16: accuracy {verification['accuracy']:.3f} (float {torch_digits_net.float_accuracy:.3f}), "
          f"max abs error {verification['max_abs_error']:.4g}, cosine {verification['cosine_similarity']}, XNNPACK "
          f"{record['pte']['delegated_nodes']} of {record['pte']['total_nodes']} nodes, {record['bytes']} bytes")
    assert verification["accuracy"] >= torch_digits_net.float_accuracy - 0.01
    assert verification["top1_agreement"] >= 0.99 and verification["cosine_similarity"] >= 0.99
    assert 1e-3 < verification["max_abs_error"] < 0.1  # half arithmetic (0.011): not an fp32 program (1e-5), not broken
    assert record["pte"]["delegated_nodes"] >= 0.7 * record["pte"]["total_nodes"]  # the casts at the border stay out
    assert 100 * record["pte"]["delegated_share"] >= shipped_pte_floor()
    info = inspect_model(out / record["file"])
    assert info.precision == "fp16" and info.inputs[0].dtype == "float32" and info.outputs[0].dtype == "float32"
    report = reports(check(executorch_env, out, "--runs", "5"))["model.fp16.pte"]
    assert report["error"] is None and report["outputs_match"]["ok"] is True, report
    assert report["bundled_check"]["ok"] is True and report["bundled_check"]["cases"] == 4, report["bundled_check"]


def test_bundled_program_checks_its_numbers(pte_digits_bundle: tuple[Path, dict[str, Any]]) -> None:
    from executorch.extension.pybindings import portable_lib

    out, manifest = pte_digits_bundle
    for precision in ("fp32", "int8"):
        pte = _artifact(manifest, precision)["pte"]
        bundled = portable_lib._load_bundled_program_from_buffer((out / pte["bundled"]).read_bytes())
        for case in range(4):
            bundled.verify_result_with_bundled_expected_output("forward", case, 0.0, pte["bundled_atol"])
        if precision == "int8":  # INT8 differs from the float outputs: an exact check must fail (not vacuous)
            with pytest.raises(RuntimeError):
                bundled.verify_result_with_bundled_expected_output("forward", 0, 0.0, 1e-7)


def test_transformer_pte_int8(pte_encoder_bundle: tuple[Path, dict[str, Any]], torch_digits_encoder: TorchModel
                              ) -> None:
    _, manifest = pte_encoder_bundle
    for precision in ("fp32", "int8"):
        record = _artifact(manifest, precision)
        accuracy = record["verification"]["accuracy"]
        print(f"encoder {precision}: accuracy {accuracy:.3f} (float {torch_digits_encoder.float_accuracy:.3f}), "
              f"delegated {record['pte']['delegated_share']:.2f}, status {record['status']}")
        assert accuracy >= torch_digits_encoder.float_accuracy - (0.001 if precision == "fp32" else 0.03)
        assert shipped_pte_floor() <= 100 * record["pte"]["delegated_share"] <= 100  # the profiles' row admits it


def test_non_torch_source_refused_naming_the_route(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph), tmp_path / "relu.onnx")
    with pytest.raises(UsageError, match="PyTorch models only") as info:
        api.convert(str(tmp_path / "relu.onnx"), formats=["pte"], out=tmp_path / "b", progress=lambda m: None)
    assert "--format tflite / onnx" in (info.value.hint or "")


def test_exported_program_to_pte_int8(torch_digits_net: TorchModel, tmp_path: Path) -> None:
    """An ExportedProgram (.pt2) through the route itself: INT8 with the user's calibration, run in ExecuTorch
    against eager PyTorch on the held-out digits; dynamic refused naming the route that builds it."""
    import torch

    from tests.sources.test_torch_source import _eager
    from toolkit.conversion.executorch import convert as torch_pte
    from toolkit.conversion.base import ConversionRequest
    from toolkit.runtimes.execution import open_session
    from toolkit.sources.detect import open_source
    from toolkit.model.recipe import Recipe

    path = tmp_path / "digits.pt2"
    eager = _eager(torch_digits_net)
    torch.export.save(torch.export.export(eager, (torch.zeros(1, 1, 8, 8),)), str(path))
    source = open_source(str(path))

    def request(precision: str) -> ConversionRequest:
        return ConversionRequest(source=source, recipe=Recipe(format="pte", precision=precision),
                                 input_shapes={torch_digits_net.input_name: torch_digits_net.input_shape},
                                 calibration=torch_digits_net.calibration(64), workdir=tmp_path)

    built = torch_pte.convert(request("int8"), tmp_path / "model.int8.pte")
    assert built.pte is not None and built.pte.delegated_share >= 0.8
    session = open_session(built.path, threads=1)
    x = torch_digits_net.x_heldout[:100]
    got = np.concatenate([session.run({"input_0": x[i:i + 1]})[0] for i in range(len(x))])
    with torch.no_grad():
        want = eager(torch.from_numpy(x)).numpy()
    assert float(np.mean(got.argmax(1) == want.argmax(1))) >= 0.97
    with pytest.raises(UsageError) as info:
        torch_pte.convert(request("dynamic"), tmp_path / "model.dynamic.pte")
    assert "does not build dynamic" in info.value.message and "--format onnx" in (info.value.hint or "")
