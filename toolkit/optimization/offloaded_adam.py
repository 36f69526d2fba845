"""The offloaded Adam/AdamW itself and the fine-tune loop's optimizer choice (toolkit.optimization.offload says what
and why); torch is imported at the top, so only the fine-tune loop imports this module."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch.optim.adam import adam

from toolkit.errors import UsageError
from toolkit.optimization.offload import Offload, state_directory


class _DiskMoments:
    """Both moments of every parameter in one unlinked file, ``[m_0 | v_0 | m_1 | v_1 | ...]``, read into and
    written from one buffer sized for the largest parameter."""

    def __init__(self, masters: list[torch.Tensor], directory: Path) -> None:
        self.offsets: list[int] = []
        self.nbytes: list[int] = []
        offset = 0
        for master in masters:
            size = master.numel() * master.element_size()
            self.offsets.append(offset)
            self.nbytes.append(size)
            offset += 2 * size
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".edgetk-adam-", suffix=".state", dir=directory)
        os.unlink(name)  # gone with the descriptor, even if the process dies
        self.fd = fd
        os.ftruncate(fd, offset)  # a sparse file: never-written moments read back as zeros, as Adam starts
        self.buffer = torch.empty(2 * max(self.nbytes, default=0), dtype=torch.uint8)
        self.masters = masters

    def _views(self, index: int) -> tuple[torch.Tensor, torch.Tensor, memoryview]:
        size = self.nbytes[index]
        master = self.masters[index]
        raw = self.buffer[: 2 * size]
        m = raw[:size].view(master.dtype).view(master.shape)
        v = raw[size:].view(master.dtype).view(master.shape)
        return m, v, memoryview(raw.numpy().data).cast("B")

    def load(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        m, v, raw = self._views(index)
        done = 0
        while done < len(raw):
            got = os.preadv(self.fd, [raw[done:]], self.offsets[index] + done)
            if got <= 0:
                raise OSError(f"optimizer state file ended early at parameter {index}")
            done += got
        return m, v

    def store(self, index: int) -> None:
        _, _, raw = self._views(index)
        done = 0
        while done < len(raw):
            done += os.pwritev(self.fd, [raw[done:]], self.offsets[index] + done)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


class OffloadedAdam(torch.optim.Optimizer):
    """Adam (or AdamW with ``decoupled_weight_decay``) whose moments live in host memory or a file
    (``offload``), updated on the CPU one parameter at a time. Use as a context manager or call
    :meth:`close` to release the state file."""

    def __init__(self, params: Iterable[torch.Tensor], *, offload: Offload, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 decoupled_weight_decay: bool = False, directory: Path | None = None) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(list(params), defaults)
        self.offload = offload
        self._params: list[torch.Tensor] = [p for group in self.param_groups for p in group["params"]]
        # The float32 master each update runs on: the parameter itself when it is on the CPU, else a host copy.
        pin = torch.cuda.is_available()
        self._on_host = [p.device.type == "cpu" for p in self._params]
        self._masters: list[torch.Tensor] = [
            p.detach() if p.device.type == "cpu" else p.detach().to("cpu", torch.float32).pin_memory() if pin
            else p.detach().to("cpu", torch.float32) for p in self._params]
        self._steps = [torch.tensor(0.0) for _ in self._params]
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._host: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self._params)
        self._disk = (_DiskMoments(self._masters, directory or Path(tempfile.gettempdir()))
                      if offload is Offload.DISK else None)

    def __enter__(self) -> OffloadedAdam:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the state file (disk) or the host moments (cpu)."""
        if self._disk is not None:
            self._disk.close()
        self._host = [None] * len(self._params)

    def _moments(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._disk is not None:
            return self._disk.load(index)
        held = self._host[index]
        if held is None:
            master = self._masters[index]
            held = (torch.zeros_like(master, memory_format=torch.preserve_format),
                    torch.zeros_like(master, memory_format=torch.preserve_format))
            self._host[index] = held
        return held

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                index = self._index[id(param)]
                master = self._masters[index]
                on_host = self._on_host[index]
                grad = param.grad if on_host else param.grad.to("cpu", master.dtype)
                m, v = self._moments(index)
                adam([master], [grad], [m], [v], [], [self._steps[index]], foreach=False,
                     decoupled_weight_decay=group["decoupled_weight_decay"], amsgrad=False, beta1=beta1,
                     beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                     maximize=False)
                if self._disk is not None:
                    self._disk.store(index)
                if not on_host:
                    param.copy_(master)  # back up to the accelerator
        return loss


def make_adam(params: list[torch.nn.Parameter], *, learning_rate: float, offload: Offload | None, device: str,
              directory: Path | None = None) -> torch.optim.Optimizer:
    """The fine-tune loop's optimizer: plain ``torch.optim.Adam``, or ``OffloadedAdam``. ``Offload.CPU``
    with a model that trains on the CPU is refused: its state is in host memory already."""
    if offload is None:
        return torch.optim.Adam(params, lr=learning_rate)
    if offload is Offload.CPU and device == "cpu":
        raise UsageError(
            "--offload-optimizer cpu moves the optimizer state off an accelerator, but this model trains on the "
            "CPU, where its state is in host memory already.",
            hint="Use --offload-optimizer disk to keep the Adam state in a file instead of host memory (cpu "
                 "pays on a CUDA GPU, where the loop trains with --mixed-precision fp16).")
    if offload is Offload.DISK and directory is None:
        directory = state_directory()
    return OffloadedAdam(params, offload=offload, lr=learning_rate, directory=directory)
