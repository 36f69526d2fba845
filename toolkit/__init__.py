"""edge-toolkit: take a trained model to your own small devices and prove it runs there.

The public API mirrors the CLI: ``toolkit.convert``, ``toolkit.deploy``, ``toolkit.check``, ``toolkit.run``.
They are imported lazily so that ``import toolkit`` stays light.
"""

from __future__ import annotations

from typing import Any

from toolkit.__about__ import __version__

__all__ = ["__version__", "convert", "deploy", "check", "run", "inspect"]


def __getattr__(name: str) -> Any:
    if name in ("convert", "deploy", "check", "run", "inspect", "rollback", "status", "probe", "optimize"):
        from toolkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
