"""edge-toolkit: take a trained model to your own small devices and prove it runs there.

The public API mirrors the CLI: ``toolkit.convert``, ``toolkit.deploy``, ``toolkit.check``, ``toolkit.run``,
``toolkit.inspect``, ``toolkit.rollback``, ``toolkit.status``, ``toolkit.remove``, ``toolkit.prune``,
``toolkit.probe``, ``toolkit.setup``, ``toolkit.add_key``, ``toolkit.optimize``, ``toolkit.history``, ``toolkit.make_report``, ``toolkit.list_targets``,
``toolkit.show_target`` (docs/api.md). They are imported lazily from ``toolkit.api`` so that ``import toolkit``
stays light. Module names are nouns, so no submodule ever shadows one of these functions.
"""

from __future__ import annotations

from typing import Any  # Any: the API function __getattr__ imports lazily

from toolkit.__about__ import __version__

# Keep in sync with toolkit.api (tests/test_api.py checks that each is a function).
_API = ("convert", "deploy", "check", "run", "inspect", "rollback", "status", "remove", "probe", "setup", "optimize",
        "quickstart", "history", "make_report", "list_targets", "show_target", "prune", "add_key")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from toolkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
