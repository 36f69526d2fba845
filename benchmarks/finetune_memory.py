"""Memory-lean fine-tuning (issue 17): activation checkpointing and optimizer-state offloading to disk on a
~50M-parameter transformer encoder, side by side with the plain loop, through the toolkit's own ``fine_tune``
(``edgetk optimize --checkpoint-activations``, ``--offload-optimizer disk``).

Memory: each variant runs in a fresh process (a heap of its own) and the peak resident memory is the process's
VmHWM, read from /proc; under glibc's default malloc and with its mmap threshold fixed
(``MALLOC_MMAP_THRESHOLD_=65536``: freed activations go back to the system instead of staying in the heap as
holes), since the saving a user sees depends on it. Time: one process alternates the variants, one two-step
``fine_tune`` call each, and times the second step (the offloaded state then streams real data, not the sparse
file's holes), so that the shared machine's load falls on all alike; each ratio is the median over the rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

from benchmarks.common import REPO, log, table

TITLE = "Fine-tuning memory: activation checkpointing, optimizer state on disk (issue 17)"
LAYERS, WIDTH, HEADS, FF = 16, 512, 8, 2048  # 16 x 3.15M = 50.4M parameters
BATCH, SEQ, STEPS, PAIRS, TIMED_ROUNDS = 8, 128, 2, 1, 3
# name -> (checkpoint_activations, offload_optimizer)
VARIANTS = {"plain": (0, ""), "checkpointed": (1, ""), "state on disk": (0, "disk")}

CHILD = r"""
import json, sys, time
import numpy as np
import torch
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.memory import peak_rss_mb, reset_peak_rss, rss_mb
from toolkit.optimization.offload import parse_offload
from toolkit.optimization.training import FineTuneConfig, fine_tune

layers, width, heads, ff, batch, seq, steps, checkpoint, timed_rounds = (int(v) for v in sys.argv[1:10])
offload = parse_offload(sys.argv[10] or None)
variants = json.loads(sys.argv[11])
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
if timed_rounds:  # the timing child: alternate the variants, time the second step of a two-step fine-tune
    two = LabelledData(inputs=(x[:2 * batch],), labels=y[:2 * batch], path=data.path)
    times = {name: [] for name in variants}
    for round_ in range(timed_rounds + 1):  # the first round warms up (allocator, thread pools)
        for name, (ck, off) in variants.items():
            marks = [time.perf_counter()]
            fine_tune(model, two, config=FineTuneConfig(epochs=1, batch_size=batch, learning_rate=1e-4,
                                                          checkpoint_activations=bool(ck),
                                                          offload_optimizer=parse_offload(off or None)),
                      after_update=lambda i: marks.append(time.perf_counter()))
            if round_:
                times[name].append(marks[2] - marks[1])
    print(json.dumps({"params": params, "times": times}))
    raise SystemExit(0)
marks = []
before = rss_mb()
reset_peak_rss()
start = time.perf_counter()
loss = fine_tune(model, data, config=FineTuneConfig(epochs=1, batch_size=batch, learning_rate=1e-4,
                                                      checkpoint_activations=bool(checkpoint),
                                                      offload_optimizer=offload),
                 after_update=lambda i: marks.append(time.perf_counter()))
steps_s = [b - a for a, b in zip([start, *marks[:-1]], marks)]
print(json.dumps({"params": params, "before_mb": before, "peak_mb": peak_rss_mb(), "steps_s": steps_s,
                  "loss": loss}))
"""


def _child(variant: str, *, fixed_threshold: bool, timed_rounds: int = 0) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if fixed_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    checkpoint, offload = VARIANTS[variant]
    argv = [str(v) for v in (LAYERS, WIDTH, HEADS, FF, BATCH, SEQ, STEPS, checkpoint, timed_rounds)]
    result = subprocess.run([sys.executable, "-c", CHILD, *argv, offload, json.dumps(VARIANTS)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=3600, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def run() -> tuple[str, dict[str, Any]]:
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for fixed in (False, True):
        malloc = "MALLOC_MMAP_THRESHOLD_=65536" if fixed else "glibc default"
        for pair in range(PAIRS):
            for variant in VARIANTS:
                log(f"memory: {malloc}, {variant} ({pair + 1}/{PAIRS})")
                runs.setdefault((malloc, variant), []).append(_child(variant, fixed_threshold=fixed))
    log(f"time: {TIMED_ROUNDS} rounds of the variants alternated in one process")
    timed = _child("plain", fixed_threshold=False, timed_rounds=TIMED_ROUNDS)
    times: dict[str, list[float]] = timed["times"]
    step_ratio = {name: statistics.median(v / p for p, v in zip(times["plain"], times[name]))
                  for name in VARIANTS if name != "plain"}
    rows = []
    headline: dict[str, Any] = {"step_ratio": step_ratio}
    params = timed["params"]
    for malloc in ("glibc default", "MALLOC_MMAP_THRESHOLD_=65536"):
        summary = {}
        for variant in VARIANTS:
            done = runs[(malloc, variant)]
            peak = statistics.median(r["peak_mb"] for r in done)
            grown = statistics.median(r["peak_mb"] - r["before_mb"] for r in done)
            summary[variant] = (peak, grown)
            rows.append([malloc, variant, f"{peak:.0f}", f"{grown:.0f}", f"{done[0]['loss']:.6f}"])
        key = "default" if malloc == "glibc default" else "fixed_threshold"
        headline[key] = {}
        peak0, grown0 = summary["plain"]
        for variant in VARIANTS:
            if variant == "plain":
                continue
            peak1, grown1 = summary[variant]
            rows.append([malloc, f"{variant} / plain", f"{peak1 / peak0:.2f}x", f"{grown1 / grown0:.2f}x", ""])
            headline[key][variant] = {"peak_ratio": peak1 / peak0, "growth_ratio": grown1 / grown0}
    spread = {name: (min(v / p for p, v in zip(times["plain"], times[name])),
                     max(v / p for p, v in zip(times["plain"], times[name]))) for name in step_ratio}

    def step_words(name: str) -> str:
        low, high = spread[name]
        return f"{step_ratio[name]:.2f}x step time (rounds {low:.2f}x to {high:.2f}x)"

    headline["headline"] = {
        f"Fine-tune peak memory with activation checkpointing vs without ({params / 1e6:.0f}M-param encoder)":
            f"{headline['default']['checkpointed']['peak_ratio']:.2f}x peak, {step_words('checkpointed')}",
        f"Fine-tune peak memory with Adam's state on disk vs in memory ({params / 1e6:.0f}M-param encoder)":
            f"{headline['default']['state on disk']['peak_ratio']:.2f}x peak, {step_words('state on disk')}",
    }
    names = list(VARIANTS)
    time_rows = [[*(f"{times[n][i]:.2f}" for n in names),
                  *(f"{times[n][i] / times['plain'][i]:.2f}x" for n in names if n != "plain")]
                 for i in range(len(times["plain"]))]
    state_mb = 2 * 4 * params / 2**20
    markdown = (
        f"## {TITLE}\n\n"
        f"A transformer encoder of {params / 1e6:.1f}M parameters ({LAYERS} layers, width {WIDTH}, {HEADS} heads, "
        f"feed-forward {FF}), batch {BATCH} x {SEQ} tokens, Adam, fp32, 2 threads, through "
        "`toolkit.optimization.training.fine_tune` (what `edgetk optimize --train-data ... "
        "--checkpoint-activations` / `--offload-optimizer disk` runs). Adam's two moments of this model are "
        f"{state_mb:.0f} MiB.\n\n"
        "Memory: each variant is a fresh process; peak = the process's VmHWM over "
        f"{STEPS} optimizer steps (weights, gradients and Adam state included), growth = peak minus the resident "
        f"size before the first step ({PAIRS} process(es) per variant). The loss column is the same steps computed "
        "each way: checkpointing recomputes and the offloaded Adam runs torch's own update on the streamed state, "
        "so neither approximates.\n\n"
        + table(["malloc", "variant", "peak MiB", "growth MiB", "loss"], rows)
        + f"\n\nTime: one process, {TIMED_ROUNDS} rounds of the variants alternated after a warm-up round, each a "
        "two-step fine-tune whose second step is timed; ratios are medians over the rounds ("
        + ", ".join(f"{n} / plain = {r:.2f}x" for n, r in step_ratio.items())
        + "). Seconds per step:\n\n"
        + table([*(f"{n} s" for n in names), *(f"{n} / plain" for n in names if n != "plain")], time_rows)
        + "\n\nThe state file is written through the page cache (what the kernel evicts under pressure, unlike "
        "anonymous memory, which needs swap); `--offload-optimizer cpu` (state and step in host memory while the "
        "model trains on a GPU) cannot be measured on this CPU-only host."
    )
    return markdown, headline
