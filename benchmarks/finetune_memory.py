"""Memory-lean fine-tuning (issue 17): activation checkpointing on a ~50M-parameter transformer encoder, side by
side with the plain loop, through the toolkit's own ``fine_tune`` (``edgetk optimize --checkpoint-activations``).

Memory: each variant runs in a fresh process (a heap of its own) and the peak resident memory is the process's
VmHWM, read from /proc; under glibc's default malloc and with its mmap threshold fixed
(``MALLOC_MMAP_THRESHOLD_=65536``: freed activations go back to the system instead of staying in the heap as
holes), since the saving a user sees depends on it. Time: one process alternates plain and checkpointed steps
(one ``fine_tune`` call of one step each), so that the shared machine's load falls on both alike; the ratio is
the median of the adjacent pairs.
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
BATCH, SEQ, STEPS, PAIRS, TIMED_PAIRS = 8, 128, 2, 1, 4

CHILD = r"""
import json, sys, time
import numpy as np
import torch
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.memory import peak_rss_mb, reset_peak_rss, rss_mb
from toolkit.optimization.training import FineTuneConfig, fine_tune

layers, width, heads, ff, batch, seq, steps, checkpoint, timed_pairs = (int(v) for v in sys.argv[1:10])
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
if timed_pairs:  # the timing child: alternate one-step fine-tunes, plain then checkpointed
    one = LabelledData(inputs=(x[:batch],), labels=y[:batch], path=data.path)
    times = {0: [], 1: []}
    for pair in range(timed_pairs + 1):  # the first pair warms up (allocator, thread pools)
        for ck in (0, 1):
            begin = time.perf_counter()
            fine_tune(model, one, config=FineTuneConfig(epochs=1, batch_size=batch, learning_rate=1e-4,
                                                          checkpoint_activations=bool(ck)))
            if pair:
                times[ck].append(time.perf_counter() - begin)
    print(json.dumps({"params": params, "plain_s": times[0], "checkpointed_s": times[1]}))
    raise SystemExit(0)
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


def _child(checkpoint: bool, *, fixed_threshold: bool, timed_pairs: int = 0) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if fixed_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    argv = [str(v) for v in (LAYERS, WIDTH, HEADS, FF, BATCH, SEQ, STEPS, int(checkpoint), timed_pairs)]
    result = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=1800, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run() -> tuple[str, dict[str, Any]]:
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for fixed in (False, True):
        malloc = "MALLOC_MMAP_THRESHOLD_=65536" if fixed else "glibc default"
        for pair in range(PAIRS):
            for checkpoint in (False, True):
                log(f"memory: {malloc}, {'checkpointed' if checkpoint else 'plain'} ({pair + 1}/{PAIRS})")
                runs.setdefault((malloc, checkpoint), []).append(_child(checkpoint, fixed_threshold=fixed))
    log(f"time: {TIMED_PAIRS} alternated pairs of one-step fine-tunes in one process")
    timed = _child(False, fixed_threshold=False, timed_pairs=TIMED_PAIRS)
    step_ratio = statistics.median(c / p for p, c in zip(timed["plain_s"], timed["checkpointed_s"]))
    rows = []
    headline: dict[str, Any] = {"step_ratio": step_ratio}
    params = timed["params"]
    for malloc in ("glibc default", "MALLOC_MMAP_THRESHOLD_=65536"):
        summary = {}
        for checkpoint in (False, True):
            done = runs[(malloc, checkpoint)]
            peak = statistics.median(r["peak_mb"] for r in done)
            grown = statistics.median(r["peak_mb"] - r["before_mb"] for r in done)
            summary[checkpoint] = (peak, grown)
            rows.append([malloc, "checkpointed" if checkpoint else "plain", f"{peak:.0f}", f"{grown:.0f}",
                         f"{done[0]['loss']:.6f}"])
        (peak0, grown0), (peak1, grown1) = summary[False], summary[True]
        rows.append([malloc, "checkpointed / plain", f"{peak1 / peak0:.2f}x", f"{grown1 / grown0:.2f}x", ""])
        key = "default" if malloc == "glibc default" else "fixed_threshold"
        headline[key] = {"peak_ratio": peak1 / peak0, "growth_ratio": grown1 / grown0}
    headline["headline"] = {
        f"Fine-tune peak memory with activation checkpointing vs without ({params / 1e6:.0f}M-param encoder)":
            f"{headline['default']['peak_ratio']:.2f}x peak, {step_ratio:.2f}x step time",
    }
    time_rows = [[f"{p:.2f}", f"{c:.2f}", f"{c / p:.2f}x"] for p, c in zip(timed["plain_s"], timed["checkpointed_s"])]
    markdown = (
        f"## {TITLE}\n\n"
        f"A transformer encoder of {params / 1e6:.1f}M parameters ({LAYERS} layers, width {WIDTH}, {HEADS} heads, "
        f"feed-forward {FF}), batch {BATCH} x {SEQ} tokens, Adam, fp32, 2 threads, through "
        "`toolkit.optimization.training.fine_tune` (what `edgetk optimize --train-data ... "
        "--checkpoint-activations` runs).\n\n"
        "Memory: each variant is a fresh process; peak = the process's VmHWM over "
        f"{STEPS} optimizer steps (weights, gradients and Adam state included), growth = peak minus the resident "
        f"size before the first step ({PAIRS} process(es) per variant). The loss column is the same steps computed "
        "both ways: checkpointing recomputes, it does not approximate.\n\n"
        + table(["malloc", "variant", "peak MiB", "growth MiB", "loss"], rows)
        + f"\n\nTime: one process, {TIMED_PAIRS} pairs of one-step fine-tunes alternated (plain, checkpointed) "
        f"after a warm-up pair; checkpointed / plain = {step_ratio:.2f}x (median of the pairs; the extra forward "
        "per block). Seconds per step:\n\n"
        + table(["plain s", "checkpointed s", "ratio"], time_rows)
        + "\n\nCPU offloading of optimizer state is not offered: on this CPU-only host the optimizer state is "
        "already in host memory, so there is nothing to offload to and nothing to measure; it pays when the "
        "model trains on a GPU, which this machine does not have."
    )
    return markdown, headline
