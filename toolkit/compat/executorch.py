"""ExecuTorch's private members that edgetk relies on (pinned: executorch==1.5.1, pyproject.toml).

- The portable runtime's thread pool size (host timing with the device's thread count, ``runtimes/execution/
  pte``); the pybindings have no public setter.
"""

from __future__ import annotations

from toolkit.compat import Member

PIN = "executorch==1.5.1"

MEMBERS = (Member("executorch.extension.pybindings.portable_lib", "_unsafe_reset_threadpool"),)


def set_threads(threads: int) -> None:
    """Size the ExecuTorch runtime's thread pool of this process to ``threads``."""
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(int(threads))
