"""ExecuTorch's private members that edgetk relies on (pinned: executorch==1.5.1, pyproject.toml).

- The portable runtime's thread pool size (host timing with the device's thread count, ``runtimes/execution/
  pte``); the pybindings have no public setter.
- A .pte file read back as its program (``runtimes/inspection/pte``: the operators and delegates of each plan).
- On the device, the runner's ExecuTorch block (``device_side/src/runner/executorch_binding.py``, which cannot
  import toolkit/) sizes the thread pool the same way, loads a bundled program (the pybindings' own verifier) and
  asks the loaded program whether the runtime was built with the event tracer: those members are listed here too,
  so the same test names the pin when one moves.
"""

from __future__ import annotations

from typing import Any

from toolkit.compat import Member

PIN = "executorch==1.5.1"

MEMBERS = (
    Member("executorch.extension.pybindings.portable_lib", "_unsafe_reset_threadpool"),
    Member("executorch.exir._serialize._program", "deserialize_pte_binary"),
    Member("executorch.extension.pybindings.portable_lib", "_load_bundled_program_from_buffer"),  # the runner
    Member("executorch.runtime:Program", "_program", instance=True),  # the runner: has_etdump()
)


def set_threads(threads: int) -> None:
    """Size the ExecuTorch runtime's thread pool of this process to ``threads``."""
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(int(threads))


def pte_program(data: bytes) -> Any:  # Any: ExecuTorch's schema Program (its plans, operators, delegates)
    """The program a .pte file's bytes hold, as ExecuTorch's schema objects."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(data)
