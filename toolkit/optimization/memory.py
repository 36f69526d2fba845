"""Memory-lean fine-tuning: activation checkpointing for PyTorch models, and the process's own peak memory.

Checkpointing: each repeated block (a ``nn.ModuleList``'s entries, else the children of the largest
``nn.Sequential``) keeps only its input and recomputes its activations in backward (non-reentrant
``torch.utils.checkpoint``). Keras 3 uses ``keras.RematScope(mode="activations")`` in the training clone;
not ``mode="full"``, which TensorFlow refuses under ``fit``'s ``tf.function`` (docs/optimization.md has why
and the figures). Peak memory is read from the process (``VmHWM``, reset through ``clear_refs``), never
estimated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any  # Any: a block's forward, wrapped with whatever it takes and returns

from toolkit.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

KERAS_REMAT_MODE = "activations"  # keras.RematScope mode for Keras fine-tuning (the one tf.function accepts)


def checkpoint_blocks(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``module`` whose activations checkpointing recomputes (empty when none)."""
    import torch

    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) >= 2]
    if lists:
        seen: set[int] = set()
        blocks = []
        for modules in lists:  # the outermost lists: a block inside a checkpointed block is recomputed anyway
            for block in modules:
                if id(block) not in seen:
                    blocks.append(block)
                    seen.update(id(m) for m in block.modules())
        return blocks
    sequences: list[nn.Sequential] = [m for m in module.modules()
                                      if isinstance(m, torch.nn.Sequential) and len(m) >= 2]
    if not sequences:
        return []
    longest: nn.Sequential = max(sequences, key=lambda m: len(m))
    return list(longest)


@contextmanager
def activation_checkpointing(module: nn.Module) -> Iterator[int]:
    """While inside, each block of ``module`` recomputes its activations in backward; yields how many blocks.
    Without gradients (evaluation) blocks run as usual. The module is left as it was on exit."""
    from torch.utils.checkpoint import checkpoint

    blocks = checkpoint_blocks(module)
    if not blocks:
        raise UsageError(
            f"Activation checkpointing found no repeated blocks in {type(module).__name__} (no nn.ModuleList or "
            "nn.Sequential of two or more modules).",
            hint="Build the model's layers as an nn.ModuleList (or nn.Sequential), or fine-tune without "
                 "--checkpoint-activations.",
        )
    import torch

    for block in blocks:
        original = block.forward

        def forward(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                return checkpoint(_original, *args, use_reentrant=False, **kwargs)
            return _original(*args, **kwargs)

        block.forward = forward  # an instance attribute: nn.Module.__call__ finds it first
    try:
        yield len(blocks)
    finally:
        for block in blocks:
            del block.forward  # the class's forward again


# --------------------------------------------------------------------------------------------- peak memory


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def reset_peak_rss() -> bool:
    """Start a new peak: the high-water mark becomes the current resident size (Linux ``clear_refs`` 5).
    False where the kernel does not allow it (then :func:`peak_rss_mb` is the peak since the process began)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss_mb() -> float:
    """The process's peak resident memory in MiB since it began or since the last :func:`reset_peak_rss`."""
    try:
        return _status_kb("VmHWM") / 1024
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rss_mb() -> float:
    """The process's resident memory now, in MiB."""
    return _status_kb("VmRSS") / 1024
