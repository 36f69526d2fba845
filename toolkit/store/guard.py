"""A store that never costs a check its result: when the history database is down or refuses the login, the
reports are still returned (and printed), and either written to the local fallback file (``--store-fallback``,
for ``edgetk history sync``) or plainly not recorded. What happened is one :class:`StoreStatus`, which the
command prints after the per-device results and which makes the exit code 4.

Baseline reads that fail count as "no baseline" (the regression gate has nothing to compare with) and are
reported in the same status.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from toolkit.model.records import JsonDict
from toolkit.store.engine import StoreUnavailable
from toolkit.store.history import Store, StoredCheck
from toolkit.store.location import StoreLocation, fallback_store_path
from toolkit.model.device_records import CheckReport


@dataclass(frozen=True)
class StoreStatus:
    """Where a command's check reports went. ``error`` is None when the history answered every time."""

    location: str
    error: str | None = None
    recorded: int = 0
    fallback: str | None = None  # the local file the reports went to instead
    fallback_recorded: int = 0
    not_recorded: int = 0
    baseline_missing: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> JsonDict:
        return {
            "location": self.location, "ok": self.ok, "error": self.error, "recorded": self.recorded,
            "fallback": self.fallback, "fallback_recorded": self.fallback_recorded,
            "not_recorded": self.not_recorded, "baseline_missing": self.baseline_missing,
        }

    def lines(self) -> list[str]:
        """What to tell the user (empty when all went well)."""
        if self.ok:
            return []
        out = [str(self.error)]
        if self.fallback_recorded:
            out.append(f"{self.fallback_recorded} check result(s) were written to {self.fallback} instead: run "
                       f"`edgetk history sync --store {self.location}` when the database is back.")
        if self.not_recorded:
            out.append(f"{self.not_recorded} check result(s) were NOT recorded (pass --store-fallback to keep them "
                       "locally and sync them later).")
        if self.baseline_missing:
            out.append("No baseline could be read, so the regression gate compared nothing.")
        return out


class GuardedStore(Store):
    """``Store`` whose failures to reach the database are collected instead of raised (thread-safe)."""

    def __init__(self, location: StoreLocation | str | Path | None = None, *, fallback: bool = False) -> None:
        super().__init__(location)
        self.use_fallback = fallback
        self._lock = threading.Lock()
        self._error: str | None = None
        self._counts = {"recorded": 0, "fallback": 0, "lost": 0}
        self._baseline_missing = False

    def _failed(self, exc: StoreUnavailable) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc.message

    def probe(self) -> bool:
        """Open the database now (migrating it if needed); False (and noted) when it is unavailable."""
        try:
            self.engine()
        except StoreUnavailable as exc:
            self._failed(exc)
            return False
        return True

    def record(self, reports: Sequence[CheckReport], *, bundle: str, version: str, run_id: str,
               created_at: str | None = None, skip_existing: bool = False) -> list[str | None]:
        try:
            ids = super().record(reports, bundle=bundle, version=version, run_id=run_id, created_at=created_at,
                                 skip_existing=skip_existing)
            with self._lock:
                self._counts["recorded"] += len(ids)
            return ids
        except StoreUnavailable as exc:
            self._failed(exc)
        if self.use_fallback:
            ids = Store(fallback_store_path()).record(reports, bundle=bundle, version=version, run_id=run_id,
                                                      created_at=created_at, skip_existing=skip_existing)
            with self._lock:
                self._counts["fallback"] += len(ids)
            return ids
        with self._lock:
            self._counts["lost"] += len(reports)
        return [None] * len(reports)

    def last_passing(self, *, bundle: str, device: str, artifact: str) -> StoredCheck | None:
        try:
            return super().last_passing(bundle=bundle, device=device, artifact=artifact)
        except StoreUnavailable as exc:
            self._failed(exc)
            with self._lock:
                self._baseline_missing = True
            return None

    def status(self) -> StoreStatus:
        with self._lock:
            return StoreStatus(
                location=self.location.display, error=self._error, recorded=self._counts["recorded"],
                fallback=str(fallback_store_path()) if self._counts["fallback"] else None,
                fallback_recorded=self._counts["fallback"], not_recorded=self._counts["lost"],
                baseline_missing=self._baseline_missing,
            )


@dataclass(frozen=True)
class SyncResult:
    """``edgetk history sync``: rows copied from the fallback file into the store."""

    source: str
    store: str
    copied: int
    already_there: int

    def to_dict(self) -> JsonDict:
        return {"source": self.source, "store": self.store, "copied": self.copied, "already_there": self.already_there}


def sync(store: Store, *, source: Path | None = None) -> SyncResult:
    """Copy every row of the fallback file into ``store`` (rows it has already are kept once), then empty it."""
    path = source or fallback_store_path()
    if not path.exists():
        return SyncResult(str(path), store.location.display, 0, 0)
    local = Store(path)
    if local.location.url == store.location.url:
        from toolkit.errors import UsageError

        raise UsageError(f"{path} is the fallback file itself.", hint="Pass --store URL of the shared history.")
    rows = local.history()
    copied = store.insert_rows([r.row() for r in rows], skip_existing=True)
    local.delete([r.check_id for r in rows])
    return SyncResult(str(path), store.location.display, copied, len(rows) - copied)
