"""Selective quantization on the PyTorch -> TFLite route (litert-torch PT2E), on a trained model that full INT8
really breaks.

The outlier net: the trained digits conv net (``torch_digits_net``, about 98% on the held-out digits) with ONE
unit of ``fc1`` scaled by 4000 and the matching column of ``fc2`` by 1/4000. ReLU is positively homogeneous, so
the float model computes the same function (same accuracy); but ``fc1``'s output now has one outlier channel:
its per-tensor int8 scale is set by the outlier and the other 127 units collapse, and ``fc2``'s 1/4000 weights
round to zero in int8. Full PT2E INT8 drops to about chance. Keeping ``fc1`` (FX node ``linear``) and its
consumer ``fc2`` (``linear_1``) in float brings it back; keeping either alone does not.

Needs the ``litert-torch`` extra (CI installs it through ``[all]``); skipped with that reason without it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.torch_models import TorchModel
from toolkit.conversion.base import ConversionRequest
from toolkit.errors import UsageError
from toolkit.runtimes.execution import open_session
from toolkit.sources.base import SourceModel
from toolkit.sources.detect import open_source
from toolkit.model.recipe import Recipe

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("litert_torch") is None,
    reason="litert-torch is not installed: pip install -e '.[litert-torch]' (CI gets it through '.[all]')",
)

OUTLIER = 4000.0
PROFILE = """extends = "raspberry-pi-4"
fallback = ["int8", "fp32"]
[[recipes]]
format = "tflite"
precision = "int8"
io_dtype = "int8"
[[recipes]]
format = "tflite"
precision = "fp32"
"""


@pytest.fixture(scope="module")
def outlier_net(torch_digits_net: TorchModel, tmp_path_factory: pytest.TempPathFactory) -> TorchModel:
    """The trained digits net with the fc1/fc2 outlier (module docstring): same float function, same accuracy."""
    import torch

    state = torch.load(torch_digits_net.weights)
    x = torch.from_numpy(torch_digits_net.x_calib)
    source = open_source(torch_digits_net.factory, weights=torch_digits_net.weights)
    model = source.module  # type: ignore[attr-defined]
    with torch.no_grad():
        features = torch.flatten(model.pool(torch.relu(model.conv2(torch.relu(model.conv1(x))))), 1)
        unit = int(torch.relu(model.fc1(features)).mean(dim=0).argmax())  # an active unit: calibration sees it
    state["fc1.weight"][unit] *= OUTLIER
    state["fc1.bias"][unit] *= OUTLIER
    state["fc2.weight"][:, unit] /= OUTLIER
    path = tmp_path_factory.mktemp("torch-outlier") / "outlier.pth"
    torch.save(state, path)
    outlier = open_source(torch_digits_net.factory, weights=path)
    logits = outlier.predict({"image": torch_digits_net.x_heldout})[0]
    accuracy = float((logits.argmax(axis=1) == torch_digits_net.y_heldout).mean())
    assert abs(accuracy - torch_digits_net.float_accuracy) < 0.003, (accuracy, torch_digits_net.float_accuracy)
    return dataclasses.replace(torch_digits_net, weights=path, float_accuracy=accuracy)


@pytest.fixture(scope="module")
def outlier_source(outlier_net: TorchModel) -> SourceModel:
    return open_source(outlier_net.factory, weights=outlier_net.weights)


def _request(source: SourceModel, model: TorchModel, workdir: Path, exclude: tuple[str, ...] = ()) -> ConversionRequest:
    return ConversionRequest(
        source=source,
        recipe=Recipe(format="tflite", precision="int8", io_dtype="int8", nodes_to_exclude=exclude),
        input_shapes={model.input_name: model.input_shape},
        calibration=model.calibration(100),
        workdir=workdir,
    )


def _accuracy(path: Path, model: TorchModel) -> float:
    session = open_session(path, threads=1)
    name = session.inputs[0].name
    got = np.concatenate([session.run({name: model.x_heldout[i : i + 1]})[0] for i in range(len(model.x_heldout))])
    session.close()
    return float((got.argmax(axis=1) == model.y_heldout).mean())


def test_table_ranks_the_outlier_layer_first_and_only_its_group_repairs_tflite(
    outlier_source: SourceModel, outlier_net: TorchModel, tmp_path: Path
) -> None:
    """The PT2E table's worst layer is fc1 (its units are lost) with fc1 -> fc2 as its float group; the healthy
    conv layers score a few percent. Faithful: keeping the *second* row's group float (fc2 alone) leaves the
    TFLite artifact broken (the worst group repairing it is the pipeline test's)."""
    from toolkit.conversion.pt2e import table as layers
    from toolkit.conversion.pt2e import litert as torch_tflite

    request = _request(outlier_source, outlier_net, tmp_path)
    table = layers.pt2e_table(request)
    print(json.dumps(table.to_dict(), indent=1))
    assert table.route == "tflite" and table.samples == 16
    worst, second = table.rows[0], table.rows[1]
    assert (worst.name, worst.op_type) == ("linear", "linear") and worst.channel_error > 0.5, table.rows
    assert worst.float_group == ("linear", "relu_2", "linear_1"), worst.float_group
    convs = [r for r in table.rows if r.op_type == "conv2d+relu"]
    assert len(convs) == 2 and max(r.channel_error for r in convs) < 0.05, convs
    assert [r.rank for r in table.rows] == list(range(1, len(table.rows) + 1))
    assert second.name == "linear_1" and second.float_group == ("linear_1",)
    assert [r.name for r in table.with_float(second.float_group).rows if r.kept_float] == ["linear_1"]
    built = torch_tflite.convert(_request(outlier_source, outlier_net, tmp_path, second.float_group),
                                 tmp_path / "second.tflite")
    assert built.float_nodes == ("linear_1",) and "kept in float: linear_1" in built.notes
    assert built.float_io == ()  # the float layer writes the output, yet the int8 output is kept (island inside)
    assert _accuracy(built.path, outlier_net) < outlier_net.float_accuracy - 0.5


def test_full_calibration_ranges_are_reused_exactly(outlier_source: SourceModel, outlier_net: TorchModel,
                                                    tmp_path: Path) -> None:
    """A selective rebuild copies the activation ranges of the full calibration (observers see float values
    only): its quantization parameters equal those of a fresh calibration with the same layers float."""
    import torch

    from toolkit.conversion.pt2e import quantize as pt2e

    def qparams(graph: torch.fx.GraphModule) -> list[tuple[str, float, int]]:
        return [(str(n.args[0]), float(n.args[1]), int(n.args[2])) for n in graph.graph.nodes
                if n.op == "call_function" and getattr(n.target, "__name__", "").startswith("quantize_per_tensor")]

    exclude = ("linear", "relu_2", "linear_1")
    plain = _request(outlier_source, outlier_net, tmp_path)
    args, names = pt2e.inputs(torch, plain)
    module = outlier_source.module  # type: ignore[attr-defined]
    mixed = dataclasses.replace(plain, recipe=dataclasses.replace(plain.recipe, nodes_to_exclude=exclude))
    pt2e._CACHE.clear()
    fresh = pt2e.quantize(torch, module, args, names, mixed)
    assert not fresh.reused_ranges
    pt2e.quantize(torch, module, args, names, plain)  # the full calibration, kept for this source and data
    reused = pt2e.quantize(torch, module, args, names, mixed)
    assert reused.reused_ranges and reused.kept_float == fresh.kept_float == ("linear", "linear_1")
    assert qparams(reused.graph) == qparams(fresh.graph) and len(qparams(fresh.graph)) >= 4


def test_unknown_node_names_are_refused_with_the_names_to_use(
    outlier_source: SourceModel, outlier_net: TorchModel, tmp_path: Path
) -> None:
    from toolkit.conversion.pt2e import litert as torch_tflite

    with pytest.raises(UsageError) as info:
        torch_tflite.convert(_request(outlier_source, outlier_net, tmp_path, ("fc9",)), tmp_path / "x.tflite")
    assert "fc9" in info.value.message and "--layers" in (info.value.hint or "")
    assert not (tmp_path / "x.tflite").exists()


def test_pipeline_keeps_the_worst_group_float_and_ships_int8(
    outlier_net: TorchModel, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """convert_bundle: full PT2E INT8 fails the profile's tolerance, selective quantization picks fc1 -> fc2 from
    the layer table, the mixed artifact is back at float accuracy, keeps the int8 label and int8 I/O, records
    its float nodes, and the bundle's table (shown by ``inspect --layers``) marks them kept float."""
    from toolkit import api
    from toolkit.conversion import candidate
    from toolkit.conversion.pipeline import ConvertOptions, convert_bundle

    folder = tmp_path_factory.mktemp("torch-selective")
    (folder / "profiles").mkdir()
    (folder / "profiles" / "pi4-torch-tflite.toml").write_text(PROFILE)
    np.savez(folder / "calib.npz", image=outlier_net.x_calib)
    np.savez(folder / "eval.npz", image=outlier_net.x_heldout, y=outlier_net.y_heldout)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(candidate, "is_this_host", lambda name: False)  # timings of an 8x8 net: no speed verdict
        result = convert_bundle(
            ConvertOptions(source=outlier_net.factory, weights=outlier_net.weights, target="pi4-torch-tflite",
                           targets_dirs=(folder / "profiles",), calibration=folder / "calib.npz",
                           eval_data=folder / "eval.npz", out=folder / "b", use_cache=False),
            progress=lambda message: None,
        )
    manifest = result.manifest
    for a in manifest.attempts:
        print(a.recipe.precision, a.recipe.nodes_to_exclude, a.outcome, a.reason[:200])
    int8 = [a for a in manifest.attempts if a.recipe.precision == "int8" and a.metrics]
    plain = [a for a in int8 if not a.recipe.nodes_to_exclude]
    mixed = [a for a in int8 if a.recipe.nodes_to_exclude]
    fp32 = manifest.artifact("model.fp32.tflite")
    assert fp32.verification is not None and fp32.verification.accuracy is not None
    float_acc = fp32.verification.accuracy
    assert abs(float_acc - outlier_net.float_accuracy) < 0.003
    assert len(plain) == 1 and plain[0].outcome == "dropped"
    assert (plain[0].metrics or {})["verification"]["accuracy"] < float_acc - 0.5  # full int8: about chance
    # the cheapest option is the culprit alone (its consumer re-quantizes the outlier, so it is lost still):
    # weighed against the table's errors (retry_worth) it is skipped, or built and dropped; then the culprit
    # with its consumer, which repairs it
    tried = [(a.recipe.nodes_to_exclude, a.outcome) for a in mixed]
    assert tried[-1] == (("linear", "relu_2", "linear_1"), "kept"), tried
    assert tried[:-1] in ([], [(("linear",), "dropped")]), tried
    record = manifest.artifact("model.int8.tflite")
    # fc1 holds ~92% of the weights: kept float, this int8 is mixed, labelled so and not preferred
    assert record.precision == "int8" and not record.preferred
    assert record.quantized is not None and record.quantized.mixed and record.quantized.weights < 0.1
    assert record.float_nodes == ("linear", "relu_2", "linear_1")
    assert record.verification is not None and record.verification.accuracy is not None
    assert record.verification.accuracy >= float_acc - 0.01, (record.verification.accuracy, float_acc)
    assert [(s.dtype, s.quantization is not None) for s in (*record.inputs, *record.outputs)] == [("int8", True)] * 2
    assert any(n == "kept in float: linear, linear_1" for n in record.notes), record.notes
    assert any("activation ranges of the full calibration reused" in n for n in record.notes), record.notes
    inspection = api.inspect(result.bundle_dir, layers=True)
    assert isinstance(inspection, api.BundleInspection) and inspection.layers is not None
    table = inspection.layers["model.int8.tflite"]
    assert table.rows[0].name == "linear" and table.rows[0].kept_float
    assert {r.name for r in table.rows if r.kept_float} == {"linear", "relu_2", "linear_1"}
