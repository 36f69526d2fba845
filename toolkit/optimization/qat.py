"""Quantization-aware training for PyTorch (eager mode, ``torch.ao.quantization``).

The model's Conv2d/Linear modules are swapped for their QAT versions (per-tensor symmetric int8 fake-quant on
weights) and every module's output gets an int8 (uint8 affine, moving-average min/max) fake-quant, as does the
input; the model is fine-tuned through the fake quantization (straight-through gradients), so it learns
weights that survive rounding to the int8 grid. The result is written back as a plain float model (fake-quant
removed), which ``convert`` quantizes to INT8 with calibration data like any other model: the weights are what
QAT changed. Keras 3 has no QAT here (tfmot does not take Keras 3 models; findings.md).
"""

from __future__ import annotations

import copy
from typing import Any  # Any: torch.ao.quantization is untyped; dict[str, object]: JSON-ready details

from toolkit.model.vocabulary import Framework
from toolkit.errors import UsageError
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.training import FineTuneConfig, fine_tune


def qat(
    model: models.OptimizableModel, *, train_data: LabelledData | None, config: FineTuneConfig
) -> dict[str, object]:
    if model.kind == Framework.KERAS:
        raise UsageError("Quantization-aware training is implemented for PyTorch models only.",
                         hint="For a Keras model use post-training INT8 in convert, or train it in PyTorch.")
    if not model.is_torch_module_code:
        raise UsageError(f"Quantization-aware training swaps layers, which a {model.kind} file cannot take.",
                         hint="Pass the PyTorch model as a factory path/to/file.py:make_model.")
    if train_data is None or config.epochs < 1:
        raise UsageError("Quantization-aware training fine-tunes the model, so it needs training data and at "
                         "least one epoch.", hint="Pass --train-data FILE.npz and --epochs N (N >= 1).")
    import torch
    from torch.ao import quantization as tq

    # torch.ao.quantization's factories are untyped (they return Any).
    float_module = model.model
    activation = tq.FakeQuantize.with_args(  # type: ignore[no-untyped-call, unused-ignore]
        observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype=torch.quint8,
        qscheme=torch.per_tensor_affine)
    weight = tq.FakeQuantize.with_args(  # type: ignore[no-untyped-call, unused-ignore]
        observer=tq.MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype=torch.qint8,
        qscheme=torch.per_tensor_symmetric)
    qconfig = tq.QConfig(activation=activation, weight=weight)  # type: ignore[no-untyped-call, unused-ignore]
    wrapped: Any = torch.nn.Sequential(tq.QuantStub(), copy.deepcopy(float_module))
    wrapped.qconfig = qconfig
    wrapped.train()
    prepared = tq.prepare_qat(wrapped, inplace=False)  # type: ignore[no-untyped-call, unused-ignore]
    # The input stub only records and fake-quantizes the input here; it is never converted.
    prepared[0] = activation()
    trainee = models.OptimizableModel(kind=model.kind, model=prepared, source=model.source, example=model.example,
                                      input_names=model.input_names)
    loss = fine_tune(trainee, train_data, config=config)
    state = {k.removeprefix("1."): v for k, v in prepared.state_dict().items() if k.startswith("1.")}
    float_state = float_module.state_dict()
    missing = [k for k in float_state if k not in state]
    if missing:
        raise UsageError(f"QAT could not map the trained weights back to the model ({missing[:3]}).")
    float_module.load_state_dict({k: state[k] for k in float_state})
    fake_quants = [m for m in prepared.modules() if isinstance(m, tq.FakeQuantize)]
    return {"scheme": "int8 activations (uint8 affine), int8 weights (per-tensor symmetric)",
            "fake_quant_points": len(fake_quants), "final_loss": round(loss, 5)}
