"""``edgetk optimize``: compress a Keras 3 or PyTorch model before converting it (pruning, clustering,
low-rank, distillation, QAT) and report what each step changed; ``--load-time`` measures a converted
artifact's cold-load variants (``toolkit.api.optimize``). Heavy frameworks load inside the command."""

from __future__ import annotations

from typing import Any  # Any: click's parsed values

import click

from toolkit.cli._output import emit
from toolkit.cli.options import PathType


@click.command("optimize")
@click.argument("source")
@click.option("--prune", "prune", type=float, default=None, metavar="SPARSITY",
              help="Magnitude-prune conv/dense kernels to this sparsity in (0, 1).")
@click.option("--structured", is_flag=True, help="With --prune: remove that fraction of channels, layers shrink.")
@click.option("--prune-scope", type=click.Choice(["global", "layer"]), default="global", show_default=True,
              help="Rank weights over all kernels together or within each kernel.")
@click.option("--cluster", type=int, default=None, metavar="N", help="Share N values per kernel (k-means).")
@click.option("--low-rank", "low_rank", type=float, default=None, metavar="ENERGY",
              help="Factor dense/conv layers by SVD keeping this share of the energy, in (0, 1].")
@click.option("--rank", type=int, default=None, help="A fixed rank for low-rank factorization.")
@click.option("--distill-from", "distill_from", default=None, metavar="TEACHER",
              help="Train SOURCE (the student) from this teacher model.")
@click.option("--temperature", type=float, default=4.0, show_default=True, help="Distillation temperature.")
@click.option("--alpha", type=float, default=0.3, show_default=True,
              help="Distillation weight of the hard-label loss (1 - alpha goes to the KL term).")
@click.option("--qat", is_flag=True, help="Quantization-aware fine-tuning (PyTorch).")
@click.option("--train-data", type=PathType(), default=None,
              help=".npz with inputs (by name, or x) and labels y; enables fine-tuning.")
@click.option("--eval-data", type=PathType(), default=None,
              help=".npz with inputs and labels y, for accuracy against the float baseline.")
@click.option("--epochs", type=int, default=None, help="Fine-tune epochs per step [default: 2 with --train-data].")
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--learning-rate", type=float, default=1e-3, show_default=True)
@click.option("--grad-accum", "accumulate", type=int, default=1, show_default=True,
              help="Micro-batches per optimizer update (gradient accumulation).")
@click.option("--mixed-precision", "precision", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
              show_default=True, help="Fine-tune precision: bf16 autocast on CPU, fp16 + loss scaling on a GPU.")
@click.option("--checkpoint-activations", "checkpoint_activations", is_flag=True,
              help="PyTorch: recompute each block's activations in backward instead of keeping them (less peak "
                   "memory, one more forward per block).")
@click.option("--offload-optimizer", "offload_optimizer", type=click.Choice(["cpu", "disk"]), default=None,
              help="PyTorch: keep Adam's state off the model's memory: cpu (in host memory while the model "
                   "trains on a GPU) or disk (in a file, one parameter at a time, on a CPU host).")
@click.option("--load-time", "load_time", is_flag=True,
              help="SOURCE is an .onnx/.tflite artifact: write its load-time variants (offline graph "
                   "optimizations, ORT format, external data) to the --out folder and measure each cold.")
@click.option("--device-python", default=None, metavar="PYTHON",
              help="With --load-time: the interpreter (a device-like env) that runs the runner [default: this].")
@click.option("--repeats", type=click.IntRange(1), default=5, show_default=True,
              help="With --load-time: fresh processes per variant (medians are reported).")
@click.option("--out", required=True, type=PathType(),
              help="Where to write the optimized model (.keras for Keras; .pt TorchScript or .pt2 for PyTorch); "
                   "with --load-time, a folder.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def optimize(source: str, as_json: bool, **values: Any) -> None:
    """Compress SOURCE (a Keras 3 file or a PyTorch model) and write it to --out in the same format.

    With --load-time, SOURCE is a converted artifact and the report is its cold-start load time before and
    after each load-time optimization."""
    from toolkit import api

    if values["load_time"]:  # the training knobs keep their defaults; only the techniques must be absent
        for knob in ("prune_scope", "temperature", "alpha", "epochs", "batch_size", "learning_rate", "accumulate",
                     "precision", "checkpoint_activations", "offload_optimizer", "eval_data"):
            values.pop(knob)
    else:
        values.pop("device_python")
        values.pop("repeats")
    result = api.optimize(source, **values)
    if as_json:
        emit(result.to_dict())
    else:
        click.echo(result.table())
