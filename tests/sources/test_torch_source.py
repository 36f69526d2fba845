"""PyTorch sources: factories (+ --weights), TorchScript and ExportedProgram files saved here and loaded back,
each predicting exactly what eager PyTorch predicts; and every kind of bad input refused in one message."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.cli import assert_clean_error
from tests.fixtures.torch_models import TorchModel
from toolkit.errors import UsageError
from toolkit.sources.detect import detect_framework, open_source
from toolkit.sources.torch import TorchSource, missing_shape_error


def _eager(model: TorchModel):
    """The user's own eager module with the trained weights, built without the toolkit."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("user_nets", model.nets_file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = getattr(module, model.factory.rsplit(":", 1)[1])()
    net.load_state_dict(torch.load(model.weights, weights_only=True))
    return net.eval()


def _eager_logits(model: TorchModel, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return _eager(model)(torch.from_numpy(x)).numpy()


def test_factory_with_weights_reads_declared_shapes_and_predicts_like_eager(
    torch_digits_net: TorchModel,
) -> None:
    source = open_source(torch_digits_net.factory, weights=torch_digits_net.weights)
    assert source.framework == "torch_factory"
    assert [(s.name, s.shape, s.dtype) for s in source.inputs] == [("image", (1, 1, 8, 8), "float32")]
    assert [(s.name, s.shape, s.dtype) for s in source.outputs] == [("output", (None, 10), "float32")]
    got = source.predict({"image": torch_digits_net.x_heldout})[0]
    np.testing.assert_array_equal(got, _eager_logits(torch_digits_net, torch_digits_net.x_heldout))
    assert torch_digits_net.float_accuracy >= 0.95, torch_digits_net.float_accuracy


def test_sequence_models_train_to_useful_accuracy(
    torch_digits_gru: TorchModel, torch_digits_encoder: TorchModel
) -> None:
    assert torch_digits_gru.float_accuracy >= 0.85
    assert torch_digits_encoder.float_accuracy >= 0.88


def test_factory_by_module_path_and_example_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pkg.module:make_model`` importable form; ``example_inputs()`` gives names, shapes and dtypes."""
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(
        "import torch\n"
        "class Two(torch.nn.Module):\n"
        "    def forward(self, left, right):\n"
        "        return left * 2 + right, left.sum(dim=1)\n"
        "def make_model():\n"
        "    return Two()\n"
        "def example_inputs():\n"
        "    return {'left': torch.zeros(1, 3), 'right': torch.zeros(1, 3)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert detect_framework("userpkg.nets:make_model") == "torch_factory"
    source = open_source("userpkg.nets:make_model")
    assert [(s.name, s.shape) for s in source.inputs] == [("left", (1, 3)), ("right", (1, 3))]
    assert [s.name for s in source.outputs] == ["output_0", "output_1"]
    left = np.arange(6, dtype=np.float32).reshape(2, 3)
    first, second = source.predict({"left": left, "right": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(first, left * 2 + 1)
    np.testing.assert_array_equal(second, left.sum(axis=1))


def test_factory_without_shapes_needs_input_shape(torch_digits_net: TorchModel) -> None:
    source = open_source(torch_digits_net.factory.replace("make_digits_net", "make_digits_net_bare"))
    assert isinstance(source, TorchSource)
    assert [s.name for s in source.inputs] == ["image"]  # from forward(self, image)
    assert not source.input_shapes_known
    assert "--input-shape image=" in str(missing_shape_error(source, ["image"]))  # what every route raises


def test_torchscript_saved_and_loaded_back(torch_digits_net: TorchModel, tmp_path: Path) -> None:
    import torch

    for how in ("script", "trace"):
        net = _eager(torch_digits_net)
        scripted = torch.jit.script(net) if how == "script" else torch.jit.trace(net, torch.zeros(1, 1, 8, 8))
        path = tmp_path / f"digits_{how}.pt"
        torch.jit.save(scripted, str(path))
        assert detect_framework(str(path)) == "torchscript"
        source = open_source(str(path))
        assert source.framework == "torchscript"
        assert [s.name for s in source.inputs] == ["image"]
        assert (
            isinstance(source, TorchSource) and not source.input_shapes_known
        )  # TorchScript records no shapes
        got = source.predict({"image": torch_digits_net.x_heldout})[0]
        np.testing.assert_allclose(
            got, _eager_logits(torch_digits_net, torch_digits_net.x_heldout), atol=1e-5
        )


def test_exported_program_saved_and_loaded_back(torch_digits_net: TorchModel, tmp_path: Path) -> None:
    import torch

    net = _eager(torch_digits_net)
    static = tmp_path / "digits.pt2"
    torch.export.save(torch.export.export(net, (torch.zeros(1, 1, 8, 8),)), str(static))
    source = open_source(str(static))
    assert source.framework == "exported_program"
    assert [(s.name, s.shape, s.dtype) for s in source.inputs] == [("image", (1, 1, 8, 8), "float32")]
    one = torch_digits_net.x_heldout[:1]
    np.testing.assert_allclose(
        source.predict({"image": one})[0], _eager_logits(torch_digits_net, one), atol=1e-5
    )

    dynamic = tmp_path / "digits_dynamic.pt2"
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(net, (torch.zeros(2, 1, 8, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(dynamic))
    source = open_source(str(dynamic))
    assert [s.shape for s in source.inputs] == [(None, 1, 8, 8)]
    got = source.predict({"image": torch_digits_net.x_heldout})[0]
    np.testing.assert_allclose(got, _eager_logits(torch_digits_net, torch_digits_net.x_heldout), atol=1e-5)


# --------------------------------------------------------------------------------------------- bad input


def _refused(source: str, *needles: str, weights: Path | None = None) -> str:
    with pytest.raises(UsageError) as info:
        open_source(source, weights=weights)
    text = str(info.value)
    for needle in needles:
        assert needle in text, text
    assert "Traceback" not in text
    return text


def test_pickle_that_is_not_a_model(tmp_path: Path) -> None:
    import torch

    plain = tmp_path / "plain.pt"
    plain.write_bytes(pickle.dumps({"not": "a model"}))
    _refused(str(plain), "not a TorchScript or ExportedProgram file", "factory")
    state = tmp_path / "state.pt"
    torch.save({"weight": torch.zeros(3)}, state)  # a zip, but a state dict
    _refused(str(state), "not a TorchScript or ExportedProgram file")
    fake = tmp_path / "fake.pt2"
    fake.write_bytes(b"definitely not a zip")
    _refused(str(fake), "is not an ExportedProgram", "torch.export.save")


def test_missing_factory_file_and_attribute(torch_digits_net: TorchModel, tmp_path: Path) -> None:
    _refused(f"{tmp_path}/absent.py:make_model", "does not exist")
    _refused(f"{torch_digits_net.nets_file}:make_absent", "has no attribute 'make_absent'", "make_digits_net")
    _refused("no_such_package_xyz.nets:make_model", "Cannot import the factory module")


def test_factory_returning_no_module(torch_digits_net: TorchModel) -> None:
    _refused(torch_digits_net.factory.replace("make_digits_net", "make_nothing"), "returned int", "nn.Module")


def test_factory_that_raises_and_file_that_fails_to_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def make_model():\n    raise ValueError('no data here')\n")
    _refused(f"{bad}:make_model", "raised ValueError: no data here")
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\ndef (:\n")
    _refused(f"{broken}:make_model", "Importing the factory file", "SyntaxError")


def test_weights_that_do_not_match(
    torch_digits_net: TorchModel, torch_digits_gru: TorchModel, tmp_path: Path
) -> None:
    _refused(torch_digits_net.factory, "do not fit", "conv1", weights=torch_digits_gru.weights)
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"\x00junk")
    _refused(torch_digits_net.factory, "not a state dict", weights=junk)
    _refused(torch_digits_net.factory, "does not exist", weights=tmp_path / "absent.pth")


def test_weights_with_a_torchscript_file_is_refused(torch_digits_net: TorchModel, tmp_path: Path) -> None:
    import torch

    path = tmp_path / "digits.pt"
    torch.jit.save(torch.jit.script(_eager(torch_digits_net)), str(path))
    _refused(str(path), "--weights applies to a factory source", weights=torch_digits_net.weights)


def test_wrong_input_shape_is_a_plain_error(torch_digits_net: TorchModel) -> None:
    source = open_source(torch_digits_net.factory, weights=torch_digits_net.weights)
    with pytest.raises(UsageError) as info:
        source.predict({"image": np.zeros((1, 3, 8, 8), np.float32)})
    assert "image=(1, 3, 8, 8)" in str(info.value) and "--input-shape" in str(info.value)


# --------------------------------------------------------------------------------------------- through the CLI


@pytest.fixture(scope="module")
def torch_digits_data(
    torch_digits_net: TorchModel, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """Calibration and eval .npz in the model's own NCHW layout."""
    folder = tmp_path_factory.mktemp("torch_data")
    np.savez(folder / "calib.npz", image=torch_digits_net.x_calib)
    np.savez(folder / "eval.npz", image=torch_digits_net.x_heldout, y=torch_digits_net.y_heldout)
    return folder / "calib.npz", folder / "eval.npz"


def test_cli_converts_an_exported_program_file_and_verifies_it(
    edgetk, torch_digits_net: TorchModel, torch_digits_data: tuple[Path, Path], tmp_path: Path
) -> None:
    import torch

    path = tmp_path / "digits.pt2"
    torch.export.save(torch.export.export(_eager(torch_digits_net), (torch.zeros(1, 1, 8, 8),)), str(path))
    calib, evaluation = torch_digits_data
    result = edgetk(
        "convert", path, "--calibration", calib, "--eval-data", evaluation, "--format", "onnx",
        "--precision", "fp32", "--precision", "int8", "--out", tmp_path / "bundle", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    manifest = result.json()
    assert manifest["source"]["framework"] == "exported_program"
    by_precision = {a["precision"]: a for a in manifest["artifacts"]}
    assert by_precision["fp32"]["verification"]["max_abs_error"] < 1e-4
    int8 = by_precision["int8"]["verification"]
    assert int8["accuracy"] >= int8["reference_accuracy"] - 0.01, int8
    assert (tmp_path / "bundle" / "model.int8.onnx").is_file()


def test_cli_torchscript_without_input_shape_says_which_flag(
    edgetk_inproc, torch_digits_net: TorchModel, tmp_path: Path
) -> None:
    import torch

    path = tmp_path / "digits.pt"
    torch.jit.save(torch.jit.script(_eager(torch_digits_net)), str(path))
    result = edgetk_inproc("convert", path, "--format", "onnx", "--precision", "fp32", "--out",
                           tmp_path / "bundle")
    assert_clean_error(result, 2, "does not record the shape", "--input-shape image=")
    assert not (tmp_path / "bundle" / "model.fp32.onnx").exists()


def test_cli_converts_a_torchscript_file_with_input_shape(
    edgetk, torch_digits_net: TorchModel, tmp_path: Path
) -> None:
    import torch

    path = tmp_path / "digits.pt"
    torch.jit.save(torch.jit.script(_eager(torch_digits_net)), str(path))
    result = edgetk(
        "convert", path, "--input-shape", "image=1,1,8,8", "--format", "onnx", "--precision", "fp32",
        "--out", tmp_path / "bundle", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    artifact = result.json()["artifacts"][0]
    assert artifact["verification"]["max_abs_error"] < 1e-4


HF_NETS = '''
import torch
from transformers import BertConfig, BertForSequenceClassification


class Classifier(torch.nn.Module):
    """A one-layer BERT (random weights: mechanics only) that returns a SequenceClassifierOutput."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=16, num_labels=3)
        self.model = BertForSequenceClassification(config)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids)


def make_classifier():
    return Classifier()
'''


def test_exported_program_returning_a_hugging_face_model_output_loads(tmp_path: Path) -> None:
    """torch.export.save records the ModelOutput type by name; a fresh process loads the file only once
    transformers registered it. The toolkit does that (the load runs in a subprocess that never imported
    transformers itself)."""
    import subprocess
    import sys

    import torch

    nets = tmp_path / "hf_nets.py"
    nets.write_text(HF_NETS)
    source = open_source(f"{nets}:make_classifier")
    ids = np.arange(8, dtype=np.int64).reshape(1, 8)
    expected = source.predict({"input_ids": ids})
    assert len(expected) == 1 and expected[0].shape == (1, 3)  # the ModelOutput flattened to its logits
    program = torch.export.export(source.module, (torch.from_numpy(ids),))
    torch.export.save(program, str(tmp_path / "bert.pt2"))
    np.save(tmp_path / "ids.npy", ids)
    script = (
        "import sys, numpy as np\n"
        "from toolkit.sources import open_source\n"
        "assert 'transformers' not in sys.modules\n"
        f"s = open_source({str(tmp_path / 'bert.pt2')!r})\n"
        f"out = s.predict({{'input_ids': np.load({str(tmp_path / 'ids.npy')!r})}})\n"
        f"np.save({str(tmp_path / 'got.npy')!r}, out[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "got.npy"), expected[0], rtol=1e-5, atol=1e-6)
