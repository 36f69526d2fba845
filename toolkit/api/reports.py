"""The verbs on the check history: ``history`` (and its ``sync``/``import``) and ``make_report``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.api.results import History, PathLike
from toolkit.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.reporting.html import ReportData
    from toolkit.store.guard import SyncResult
    from toolkit.store.imports import ImportResult


def history(*, device: str | None = None, bundle: str | None = None, limit: int | None = None,
            store: PathLike | None = None) -> History:
    """``edgetk history``: the stored checks (of one device or bundle, the newest ``limit``)."""
    from toolkit.store import Store

    checks = Store(store).history(device=device, bundle=bundle, limit=limit)
    return History(tuple(checks))


def history_sync(*, store: PathLike | None = None, source: PathLike | None = None) -> SyncResult:
    """``edgetk history sync``: copy the results that ``--store-fallback`` kept locally into ``store`` (each
    check once, however often it runs), then empty the local file."""
    from toolkit.store import Store
    from toolkit.store.guard import sync

    return sync(Store(store), source=Path(source) if source is not None else None)


def history_import(paths: Sequence[PathLike], *, store: PathLike | None = None,
                   device: str | None = None) -> ImportResult:
    """``edgetk history import``: record the check reports that devices left (Mender update module)."""
    from toolkit.store import Store
    from toolkit.store.imports import import_reports

    return import_reports([Path(p) for p in paths], Store(store), device=device)

def make_report(bundle: PathLike | None = None, *, whole_history: bool = False, html: PathLike | None = None,
                device: str | None = None, store: PathLike | None = None) -> ReportData:
    """``edgetk report``: a bundle's host and device measurements, or (``whole_history``) every stored check
    and the trends; ``html`` also writes the self-contained page there."""
    from toolkit.reporting.html import collect, write_html

    if (bundle is None) == (not whole_history):
        raise UsageError("Pass either a BUNDLE directory or --history.",
                         hint="edgetk report bundles/NAME --html report.html, or edgetk report --history")
    data = collect(Path(bundle) if bundle is not None else None, store=store, device=device)
    if html is not None:
        write_html(data, Path(html))
    return data
