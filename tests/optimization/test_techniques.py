"""Each technique on real models trained briefly on the digits (Keras 3 CNN and a PyTorch CNN): it runs, its
claimed property holds, and accuracy after fine-tuning stays within a stated bound of the float baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from toolkit.optimization import optimize

# Accuracy after a short fine-tune may not fall more than this below the float baseline (497 held-out digits).
BOUND = 0.03


def _keras_kernels(path: Path) -> dict[str, np.ndarray]:
    import keras

    model = keras.saving.load_model(path)  # plain load: no custom objects, no wrappers
    return {f"{l.name}": np.asarray(l.kernel) for l in model.layers if hasattr(l, "kernel")}


def _torch_kernels(path: Path) -> dict[str, np.ndarray]:
    import torch

    module = torch.jit.load(str(path))
    return {n: p.detach().numpy() for n, p in module.named_parameters() if n.endswith("weight") and p.dim() >= 2}


def _sparsity(kernels: dict[str, np.ndarray]) -> float:
    return sum(int((k == 0).sum()) for k in kernels.values()) / sum(k.size for k in kernels.values())


def _within_bound(report) -> None:  # type: ignore[no-untyped-def]
    assert report.baseline.accuracy is not None and report.final.accuracy is not None
    assert report.final.accuracy >= report.baseline.accuracy - BOUND, report.table()


# --- Keras 3 -------------------------------------------------------------------------------------------------


def test_keras_prune_reaches_sparsity_and_keeps_accuracy(keras_pruned_cli):  # type: ignore[no-untyped-def]
    # the one Keras pruning run (prune 0.6, 1 epoch fine-tune) made through the CLI: tests/optimization/conftest.py
    assert keras_pruned_cli.code == 0, keras_pruned_cli.stderr
    doc = keras_pruned_cli.doc
    assert _sparsity(_keras_kernels(keras_pruned_cli.out)) >= 0.6
    assert doc["final"]["gzip_bytes"] < doc["baseline"]["gzip_bytes"] * 0.8
    # no optimizer state or wrappers in the file: it is about the size of the source
    assert doc["final"]["file_bytes"] < doc["baseline"]["file_bytes"] * 1.1
    assert doc["final"]["accuracy"] >= doc["baseline"]["accuracy"] - BOUND


def test_keras_structured_prune_shrinks_layers(digits_keras, digits_keras_train, digits_eval, tmp_path):
    import keras

    out = tmp_path / "structured.keras"
    report = optimize(digits_keras, prune=0.5, structured=True, train_data=digits_keras_train,
                      eval_data=digits_eval, epochs=2, out=out)
    model = keras.saving.load_model(out)
    convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
    denses = [l for l in model.layers if isinstance(l, keras.layers.Dense)]
    assert [c.filters for c in convs] == [8, 16]
    assert [d.units for d in denses] == [128, 10]
    assert report.final.params < report.baseline.params * 0.35
    assert report.final.macs < report.baseline.macs * 0.35
    _within_bound(report)


def test_keras_cluster_keeps_n_values_per_kernel(digits_keras, digits_keras_train, digits_eval, tmp_path):
    out = tmp_path / "clustered.keras"
    report = optimize(digits_keras, cluster=8, train_data=digits_keras_train, eval_data=digits_eval, epochs=1,
                      out=out)
    for name, kernel in _keras_kernels(out).items():
        assert np.unique(kernel).size <= 8, name
    assert report.final.gzip_bytes < report.baseline.gzip_bytes * 0.7
    _within_bound(report)


def test_keras_low_rank_reduces_params(digits_keras, digits_keras_train, digits_eval, tmp_path):
    import keras

    out = tmp_path / "low_rank.keras"
    report = optimize(digits_keras, rank=16, train_data=digits_keras_train, eval_data=digits_eval, epochs=2,
                      out=out)
    model = keras.saving.load_model(out)
    names = [l.name for l in model.layers]
    assert any(n.endswith("_lr_a") for n in names)
    factored = report.steps[0].details["factorized"]
    assert all(layer["rank"] == 16 for layer in factored.values())
    assert report.final.params < report.baseline.params * 0.5
    assert report.final.macs < report.baseline.macs
    _within_bound(report)


def test_keras_distillation_trains_a_smaller_student(digits_keras, digits_keras_train, digits_eval, tmp_path):
    import keras

    keras.utils.set_random_seed(3)
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    student_path = tmp_path / "student.keras"
    keras.Model(inputs, outputs).save(student_path)
    report = optimize(student_path, distill_from=digits_keras, train_data=digits_keras_train,
                      eval_data=digits_eval, epochs=6, out=tmp_path / "distilled.keras")
    details = report.steps[0].details
    assert details["student_params"] < details["teacher_params"] / 10
    # the untrained student learns the task from the teacher
    assert report.final.accuracy is not None and report.final.accuracy >= 0.85


# --- PyTorch -------------------------------------------------------------------------------------------------


def test_torch_prune_with_schedule_and_accumulation(digits_torch, tmp_path):
    out = tmp_path / "pruned.pt"
    report = optimize(digits_torch.factory, prune=0.7, prune_scope="layer", train_data=digits_torch.train,
                      eval_data=digits_torch.eval, epochs=2, accumulate=2, out=out)
    kernels = _torch_kernels(out)
    assert all((k == 0).mean() >= 0.7 for k in kernels.values())
    assert report.steps[0].fine_tuned
    _within_bound(report)


@pytest.mark.parametrize("fmt", ["torchscript", "exported"])
def test_torch_files_keep_their_format(digits_torch, tmp_path, fmt):
    from toolkit.sources.detect import detect_framework

    source = digits_torch.torchscript if fmt == "torchscript" else digits_torch.exported
    out = tmp_path / ("out.pt" if fmt == "torchscript" else "out.pt2")
    report = optimize(source, prune=0.5, cluster=16, eval_data=digits_torch.eval, out=out)
    assert detect_framework(str(out)) == ("torchscript" if fmt == "torchscript" else "exported_program")
    assert report.steps[0].details["sparsity"] >= 0.5
    assert max(report.steps[1].details["distinct_values"].values()) <= 16
    assert report.final.nonzero_params <= report.baseline.params * 0.55  # zeros survive clustering
    _within_bound(report)


def test_torch_structured_prune_shrinks_layers(digits_torch, tmp_path):
    out = tmp_path / "structured.pt"
    report = optimize(digits_torch.factory, prune=0.5, structured=True, train_data=digits_torch.train,
                      eval_data=digits_torch.eval, epochs=2, out=out)
    shapes = {n: k.shape for n, k in _torch_kernels(out).items()}
    assert shapes["conv1.weight"][0] == 8 and shapes["conv2.weight"][:2] == (16, 8)
    assert shapes["fc1.weight"] == (64, 256) and shapes["fc2.weight"] == (10, 64)
    assert report.final.params < report.baseline.params * 0.35
    _within_bound(report)


def test_torch_low_rank_by_energy_and_bf16(digits_torch, tmp_path):
    report = optimize(digits_torch.factory, low_rank=0.8, train_data=digits_torch.train,
                      eval_data=digits_torch.eval, epochs=1, precision="bf16", out=tmp_path / "lr.pt")
    factored = report.steps[0].details["factorized"]
    assert "fc1" in factored and factored["fc1"]["rank"] < 128
    assert report.final.params < report.baseline.params
    _within_bound(report)


def test_keras_bf16_mixed_precision_fine_tune(digits_keras, digits_keras_train, digits_eval, tmp_path):
    report = optimize(digits_keras, prune=0.5, train_data=digits_keras_train, eval_data=digits_eval, epochs=1,
                      precision="bf16", accumulate=2, out=tmp_path / "bf16.keras")
    assert report.steps[0].details["sparsity"] >= 0.5
    _within_bound(report)


def test_torch_distillation(digits_torch, tmp_path):
    student = digits_torch.factory.replace(":make_model", ":make_student")
    report = optimize(student, distill_from=digits_torch.torchscript, train_data=digits_torch.train,
                      eval_data=digits_torch.eval, epochs=3, learning_rate=1e-2, out=tmp_path / "student.pt")
    details = report.steps[0].details
    assert details["student_params"] < details["teacher_params"] / 5
    assert report.final.accuracy is not None and report.final.accuracy >= 0.85


def test_fp16_loss_scaling_steps() -> None:
    """The loss-scaling steps the fp16 loop uses, driven on the CPU with real torch ops: a good step moves the
    weights exactly as an unscaled one would (the gradients are unscaled before the update), an overflowing
    step is skipped and halves the scale, and good steps grow it again. What needs a CUDA GPU, fp16 kernels
    under autocast in the real loop, is not runnable on this machine and not claimed."""
    import torch

    from toolkit.optimization.training import backward, loss_scaler, update

    assert loss_scaler("fp32", "cpu") is None and loss_scaler("bf16", "cpu") is None
    scaler = loss_scaler("fp16", "cpu")
    assert scaler is not None and scaler.is_enabled()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
    weights = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    optimizer = torch.optim.SGD([weights], lr=0.1)
    x = torch.tensor([0.5, 1.0, -3.0])

    expected = weights.detach() - 0.1 * x  # d/dw (w . x) = x: plain SGD without any scaling
    backward((weights * x).sum(), scaler)
    assert torch.allclose(weights.grad, x * 2.0**12)  # backward saw the scaled loss
    update(optimizer, scaler)
    assert torch.allclose(weights.detach(), expected)  # ... the update the unscaled gradients
    assert scaler.get_scale() == 2.0**12

    optimizer.zero_grad()
    before = weights.detach().clone()
    backward((weights * torch.tensor([float("inf"), 1.0, 1.0])).sum(), scaler)  # an fp16 overflow
    update(optimizer, scaler)
    assert torch.equal(weights.detach(), before)  # the step was skipped, nothing poisoned with inf
    assert scaler.get_scale() == 2.0**11  # and the scale halved

    for _ in range(2):  # growth_interval good steps double it
        optimizer.zero_grad()
        backward((weights * x).sum(), scaler)
        update(optimizer, scaler)
    assert scaler.get_scale() == 2.0**12


def test_fp16_fine_tune_without_a_gpu_is_refused(digits_torch, tmp_path) -> None:
    """No GPU here: fp16 training says so and points at bf16, instead of silently training in fp32."""
    import torch

    from toolkit.errors import UsageError

    if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs the real fp16 loop instead
        pytest.skip("a CUDA GPU is present: this checks the refusal on machines without one")
    with pytest.raises(UsageError, match="needs a CUDA GPU") as refused:
        optimize(digits_torch.factory, prune=0.5, train_data=digits_torch.train, eval_data=digits_torch.eval,
                 epochs=1, precision="fp16", out=tmp_path / "fp16.pt")
    assert "bf16" in (refused.value.hint or "")
