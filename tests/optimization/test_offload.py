"""Optimizer-state offloading (toolkit.optimization.offload): the offloaded Adam gives bitwise the update of
``torch.optim.Adam``/``AdamW``, and offloading the state to disk lowers the peak memory measured from the process
(VmHWM), not a time.

There is no GPU here: ``Offload.CPU`` (state and step in host memory while the model is on an accelerator) is
checked for its numerics only, on CPU tensors, through the same class and code path the GPU uses (the
device-to-host copies are then no-ops); its memory saving on a GPU is not measured here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _trained(offload: str | None, *, weight_decay: float = 0.0, decoupled: bool = False, steps: int = 6) -> list:
    torch = pytest.importorskip("torch")
    from toolkit.optimization.offload import Offload

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.LayerNorm(24),
                              torch.nn.Linear(24, 3))
    if offload is None:
        kind = torch.optim.AdamW if decoupled else torch.optim.Adam
        optimizer = kind(net.parameters(), lr=1e-2, weight_decay=weight_decay)
    else:
        from toolkit.optimization.offloaded_adam import OffloadedAdam

        optimizer = OffloadedAdam(net.parameters(), offload=Offload(offload), lr=1e-2, weight_decay=weight_decay,
                                  decoupled_weight_decay=decoupled)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 12, generator=generator)
        loss = torch.nn.functional.cross_entropy(net(x), torch.randint(0, 3, (16,), generator=generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if offload is not None:
        optimizer.close()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize(("weight_decay", "decoupled"), [(0.0, False), (0.1, False), (0.05, True)],
                         ids=["adam", "adam-l2", "adamw"])
@pytest.mark.parametrize("offload", ["cpu", "disk"])
def test_offloaded_adam_is_bitwise_torch_adam(offload: str, weight_decay: float, decoupled: bool) -> None:
    torch = pytest.importorskip("torch")
    plain = _trained(None, weight_decay=weight_decay, decoupled=decoupled)
    offloaded = _trained(offload, weight_decay=weight_decay, decoupled=decoupled)
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded))
    assert not all(torch.equal(a, b) for a, b in zip(plain, _trained(None, steps=5)))  # the steps do move it


@pytest.mark.parametrize("offload", ["cpu", "disk"])
def test_offloaded_adam_under_fp16_loss_scaling_matches_torch_adam(offload: str) -> None:
    """The fine-tune loop's fp16 path (the one that trains on a GPU) steps through ``torch.amp.GradScaler``:
    unscale, skip a step whose gradients overflow, else step. Run here with the scaler on CPU tensors (no GPU
    here): a good step, an overflowing one (skipped, scale halved), a good one again, as plain Adam does."""
    torch = pytest.importorskip("torch")
    from toolkit.optimization.offload import Offload
    from toolkit.optimization.offloaded_adam import OffloadedAdam
    from toolkit.optimization.training import backward, update

    def run(kind: str | None) -> tuple[list, float]:  # type: ignore[type-arg]
        torch.manual_seed(0)
        net = torch.nn.Linear(6, 3)
        optimizer = (torch.optim.Adam(net.parameters(), lr=1e-2) if kind is None
                     else OffloadedAdam(net.parameters(), offload=Offload(kind), lr=1e-2))
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
        for spike in (1.0, float("inf"), 1.0):
            optimizer.zero_grad(set_to_none=True)
            backward((net(x) * spike).pow(2).mean(), scaler)
            update(optimizer, scaler)
        return [p.detach().clone() for p in net.parameters()], float(scaler.get_scale())

    (plain, plain_scale), (offloaded, scale) = run(None), run(offload)
    assert scale == plain_scale == 2.0**9  # the overflow halved it once
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded))


def test_disk_state_is_one_unlinked_file_released_on_close(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from toolkit.optimization.offload import Offload
    from toolkit.optimization.offloaded_adam import OffloadedAdam

    params = [torch.nn.Parameter(torch.ones(300, 200)), torch.nn.Parameter(torch.ones(50))]
    optimizer = OffloadedAdam(params, offload=Offload.DISK, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []  # unlinked at once: nothing is left behind, even after a crash
    fd = optimizer._disk.fd  # type: ignore[union-attr]
    assert os.fstat(fd).st_size == 2 * 4 * (300 * 200 + 50)
    assert optimizer._disk.buffer.numel() == 2 * 4 * 300 * 200  # type: ignore[union-attr]  # the largest only
    optimizer.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_cpu_offload_of_a_cpu_model_is_refused_by_name(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from toolkit.errors import UsageError
    from toolkit.optimization.offload import Offload, parse_offload
    from toolkit.optimization.offloaded_adam import make_adam

    with pytest.raises(UsageError, match="trains on the CPU") as refused:
        make_adam([torch.nn.Parameter(torch.ones(2))], learning_rate=1e-3, offload=Offload.CPU, device="cpu")
    assert "--offload-optimizer disk" in (refused.value.hint or "")
    with pytest.raises(UsageError, match="Unknown optimizer offload 'nvme'"):
        parse_offload("nvme")


def test_a_tmpfs_state_folder_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/shm is a tmpfs on Linux: a state file there would sit in RAM."""
    from toolkit.errors import UsageError
    from toolkit.optimization import offload

    if offload._filesystem_type(Path("/dev/shm")) != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs on this machine")
    monkeypatch.setenv("TMPDIR", "/dev/shm")
    monkeypatch.setattr("tempfile.tempdir", None)
    with pytest.raises(UsageError, match="tmpfs") as refused:
        offload.state_directory()
    assert "TMPDIR" in (refused.value.hint or "")


CHILD = r"""
import json, pathlib, sys
import numpy as np
import torch
from toolkit.optimization import models
from toolkit.optimization.data import LabelledData
from toolkit.optimization.memory import peak_rss_mb, reset_peak_rss, rss_mb
from toolkit.optimization.offload import parse_offload
from toolkit.optimization.training import FineTuneConfig, fine_tune

torch.manual_seed(0)
torch.set_num_threads(1)
WIDTH, DEPTH, BATCH = 1024, 12, 16  # 12.6M parameters: Adam's two moments are 96 MiB; activations are tiny
net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)], torch.nn.Linear(WIDTH, 10))
x = np.random.default_rng(0).standard_normal((3 * BATCH, WIDTH)).astype(np.float32)
y = np.random.default_rng(1).integers(0, 10, 3 * BATCH)
model = models.OptimizableModel(kind="torch_factory", model=net, source="mlp.py:make")
data = LabelledData(inputs=(x,), labels=y, path=pathlib.Path("offload.npz"))
before = rss_mb()
resettable = reset_peak_rss()
loss = fine_tune(model, data, config=FineTuneConfig(epochs=1, batch_size=BATCH, learning_rate=1e-4,
                                                      offload_optimizer=parse_offload(sys.argv[1] or None)))
print(json.dumps({"peak_mb": peak_rss_mb() - before, "resettable": resettable, "loss": loss}))
"""


def _peak(offload: str) -> dict[str, float]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # as test_memory.py: resident memory = what is alive
    result = subprocess.run([sys.executable, "-c", CHILD, offload], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_disk_offload_lowers_measured_peak_memory() -> None:
    pytest.importorskip("torch")
    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side: peak RSS (VmHWM) is per process
        plain, offloaded = pool.map(_peak, ("", "disk"))
    print(f"peak over 3 steps: plain {plain['peak_mb']:.0f} MiB, state on disk {offloaded['peak_mb']:.0f} MiB")
    assert plain["resettable"] and offloaded["resettable"]
    # Plain Adam holds two float32 moments per parameter: 2 x 12.6M x 4 B = 96 MiB. On disk only the buffer
    # for the largest parameter (2 x 4 MiB) is resident. Asked: at least half of the 96 MiB, measured.
    assert plain["peak_mb"] - offloaded["peak_mb"] > 48, (plain, offloaded)
    assert plain["loss"] == offloaded["loss"]  # the same steps, bitwise


def test_edgetk_optimize_with_the_state_on_disk_trains_the_same_model(digits_torch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Through the CLI a user runs: the trained digits CNN, pruned and fine-tuned one epoch, with Adam's state
    in memory and on disk: the same accuracy and the same weights; ``cpu`` on this CPU-only host is refused with
    the usage exit code and one plain message."""
    torch = pytest.importorskip("torch")
    from tests.fixtures.cli import run_edgetk

    outputs = {}
    for offload in (None, "disk"):
        out = tmp_path / f"pruned-{offload or 'plain'}.pt"
        args = ["optimize", digits_torch.factory, "--prune", "0.5", "--train-data", digits_torch.train, "--eval-data",
                digits_torch.eval, "--epochs", "1", "--out", out, "--json"]
        result = run_edgetk(*args, *(["--offload-optimizer", offload] if offload else []))
        assert result.code == 0, result.stderr[-2000:]
        outputs[offload] = (result.json(), torch.jit.load(str(out)).state_dict())
    (plain, plain_weights), (disk, disk_weights) = outputs[None], outputs["disk"]
    assert disk["final"]["accuracy"] == plain["final"]["accuracy"]
    assert all(torch.equal(plain_weights[k], disk_weights[k]) for k in plain_weights)
    refused = run_edgetk("optimize", digits_torch.factory, "--prune", "0.5", "--train-data", digits_torch.train, "--epochs", "1",
                         "--offload-optimizer", "cpu", "--out", tmp_path / "cpu.pt")
    assert refused.code == 2 and "trains on the CPU" in refused.stderr and "Traceback" not in refused.stderr
    assert "--offload-optimizer disk" in refused.stderr and not (tmp_path / "cpu.pt").exists()
