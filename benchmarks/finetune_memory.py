"""Memory-lean fine-tuning (issue 17): activation checkpointing on a ~50M-parameter transformer encoder, side by
side with the plain loop, through the toolkit's own ``fine_tune`` (``edgetk optimize --checkpoint-activations``).

Each variant runs in a fresh process (a heap of its own): the peak resident memory is the process's VmHWM,
read from /proc, and the step times come from the loop's own update callback. The pairs alternate
(plain, checkpointed, plain, ...) so that the machine's load falls on both alike. Run under glibc's default
malloc and with its mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_=65536``: freed activations go back to the
system instead of staying in the heap as holes), since the saving a user sees depends on it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

from benchmarks.common import REPO, log, table

TITLE = "Fine-tuning memory: activation checkpointing (issue 17)"
LAYERS, WIDTH, HEADS, FF = 16, 512, 8, 2048  # 16 x 3.15M = 50.4M parameters
BATCH, SEQ, STEPS, PAIRS = 8, 128, 3, 2

CHILD = r"""
import json, sys, time
import numpy as np
import torch
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.memory import peak_rss_mb, reset_peak_rss, rss_mb
from toolkit.optimization.training import FineTuneConfig, fine_tune

layers, width, heads, ff, batch, seq, steps, checkpoint = (int(v) for v in sys.argv[1:9])
torch.manual_seed(0)
torch.set_num_threads(2)


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(width, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


net = Encoder()
params = sum(p.numel() for p in net.parameters())
rng = np.random.default_rng(0)
x = rng.standard_normal((batch * steps, seq, width)).astype(np.float32)
y = rng.integers(0, 10, batch * steps)
model = models.OptimizableModel(kind="torch_factory", model=net, source="encoder.py:make")
data = LabelledData(inputs=(x,), labels=y, path=__import__("pathlib").Path("encoder.npz"))
marks = []
before = rss_mb()
reset_peak_rss()
start = time.perf_counter()
loss = fine_tune(model, data, config=FineTuneConfig(epochs=1, batch_size=batch, learning_rate=1e-4,
                                                      checkpoint_activations=bool(checkpoint)),
                 after_update=lambda i: marks.append(time.perf_counter()))
steps_s = [b - a for a, b in zip([start, *marks[:-1]], marks)]
print(json.dumps({"params": params, "before_mb": before, "peak_mb": peak_rss_mb(), "steps_s": steps_s,
                  "loss": loss}))
"""


def _child(checkpoint: bool, *, fixed_threshold: bool) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if fixed_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    argv = [str(v) for v in (LAYERS, WIDTH, HEADS, FF, BATCH, SEQ, STEPS, int(checkpoint))]
    result = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=1800, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run() -> tuple[str, dict[str, Any]]:
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for fixed in (False, True):
        malloc = "MALLOC_MMAP_THRESHOLD_=65536" if fixed else "glibc default"
        for pair in range(PAIRS):
            for checkpoint in (False, True):
                log(f"{malloc}, {'checkpointed' if checkpoint else 'plain'} ({pair + 1}/{PAIRS})")
                runs.setdefault((malloc, checkpoint), []).append(_child(checkpoint, fixed_threshold=fixed))
    rows = []
    headline: dict[str, Any] = {}
    params = runs[next(iter(runs))][0]["params"]
    for malloc in ("glibc default", "MALLOC_MMAP_THRESHOLD_=65536"):
        summary = {}
        for checkpoint in (False, True):
            done = runs[(malloc, checkpoint)]
            peak = statistics.median(r["peak_mb"] for r in done)
            grown = statistics.median(r["peak_mb"] - r["before_mb"] for r in done)
            step = statistics.median(s for r in done for s in r["steps_s"][1:])  # the first step allocates Adam
            summary[checkpoint] = (peak, grown, step)
            rows.append([malloc, "checkpointed" if checkpoint else "plain", f"{peak:.0f}", f"{grown:.0f}",
                         f"{step:.2f}", f"{done[0]['loss']:.6f}"])
        (peak0, grown0, step0), (peak1, grown1, step1) = summary[False], summary[True]
        rows.append([malloc, "checkpointed / plain", f"{peak1 / peak0:.2f}x", f"{grown1 / grown0:.2f}x",
                     f"{step1 / step0:.2f}x", ""])
        key = "default" if malloc == "glibc default" else "fixed_threshold"
        headline[key] = {"peak_ratio": peak1 / peak0, "growth_ratio": grown1 / grown0, "step_ratio": step1 / step0}
    headline["headline"] = {
        f"Fine-tune peak memory with activation checkpointing vs without ({params / 1e6:.0f}M-param encoder)":
            f"{headline['default']['peak_ratio']:.2f}x peak, {headline['default']['step_ratio']:.2f}x step time",
    }
    markdown = (
        f"## {TITLE}\n\n"
        f"A transformer encoder of {params / 1e6:.1f}M parameters ({LAYERS} layers, width {WIDTH}, {HEADS} heads, "
        f"feed-forward {FF}), batch {BATCH} x {SEQ} tokens, Adam, fp32, 2 threads, through "
        "`toolkit.optimization.training.fine_tune` (what `edgetk optimize --train-data ... "
        "--checkpoint-activations` runs). Each variant is a fresh process; peak = the process's VmHWM over "
        f"{STEPS} optimizer steps (weights, gradients and Adam state included), growth = peak minus the resident "
        "size before the first step, step time = median of the steps after the first (which allocates Adam's "
        f"state), over {PAIRS} processes per variant, alternated. The loss column is the same step computed "
        "both ways: checkpointing recomputes, it does not approximate.\n\n"
        + table(["malloc", "variant", "peak MiB", "growth MiB", "step s", "loss"], rows)
        + "\n\nCPU offloading of optimizer state is not offered: on this CPU-only host the optimizer state is "
        "already in host memory, so there is nothing to offload to and nothing to measure; it pays when the "
        "model trains on a GPU, which this machine does not have."
    )
    return markdown, headline
