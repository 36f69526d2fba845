"""History of every check, in SQLite: the baselines for regression gates and the trends for ``edgetk history``.

Where: ``--store PATH``, else ``$EDGETK_STORE``, else ``$XDG_DATA_HOME/edgetk/history.sqlite``, else
``~/.local/share/edgetk/history.sqlite``. One row per check report (one artifact on one device in one check
run); the full report JSON is kept, with the columns baselines and filters need beside it. Reports are written
in one transaction per run, so a check that dies half-way records nothing.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from toolkit.errors import UsageError
from toolkit.types import CheckReport

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checks (
    check_id   TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    created_at TEXT NOT NULL,
    device     TEXT NOT NULL,
    bundle     TEXT NOT NULL,
    version    TEXT NOT NULL,
    artifact   TEXT NOT NULL,
    passed     INTEGER NOT NULL,
    p50_ms     REAL,
    p90_ms     REAL,
    report     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS checks_lookup ON checks (bundle, device, artifact, created_at);
"""


def default_store_path() -> Path:
    env = os.environ.get("EDGETK_STORE")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "edgetk" / "history.sqlite"


@dataclass(frozen=True)
class StoredCheck:
    """One stored report and where it came from."""

    check_id: str
    run_id: str
    created_at: str
    device: str
    bundle: str
    version: str
    artifact: str
    passed: bool
    p50_ms: float | None
    p90_ms: float | None
    report: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The report as ``history --json`` prints it: the check report plus where and when."""
        out = dict(self.report)
        out.update(
            check_id=self.check_id,
            run_id=self.run_id,
            device=self.device,
            bundle=self.bundle,
            version=self.version,
            created_at=self.created_at,
            passed=self.passed,
        )
        return out


class Store:
    """A SQLite file; opened per operation so threads of a fleet run can share one Store object."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path).expanduser() if path else default_store_path()

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30)
            db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise UsageError(
                f"Cannot open the check history {self.path} ({exc}).",
                hint="Pass --store PATH (or set EDGETK_STORE) to a writable file.",
            ) from None
        db.row_factory = sqlite3.Row
        return db

    @staticmethod
    def new_run_id() -> str:
        return uuid.uuid4().hex[:12]

    def record(self, reports: Sequence[CheckReport], *, bundle: str, version: str, run_id: str) -> list[str]:
        """Store one run's reports (their ``check_id`` is used, or made) and return the ids, in order."""
        now = datetime.now(UTC).isoformat(timespec="microseconds")
        ids = []
        with closing(self._connect()) as db, db:
            for index, report in enumerate(reports):
                check_id = report.check_id or f"{run_id}-{index}"
                data = report.to_dict()
                data["check_id"] = check_id
                latency = report.latency_ms
                db.execute(
                    "INSERT INTO checks VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        check_id, run_id, now, report.device, bundle, version, report.artifact,
                        int(report.gates.passed), latency.p50 if latency else None,
                        latency.p90 if latency else None, json.dumps(data),
                    ),
                )
                ids.append(check_id)
        return ids

    def _rows(self, sql: str, args: Sequence[Any]) -> list[StoredCheck]:
        with closing(self._connect()) as db:
            rows = db.execute(sql, args).fetchall()
        return [
            StoredCheck(
                check_id=r["check_id"], run_id=r["run_id"], created_at=r["created_at"], device=r["device"],
                bundle=r["bundle"], version=r["version"], artifact=r["artifact"], passed=bool(r["passed"]),
                p50_ms=r["p50_ms"], p90_ms=r["p90_ms"], report=json.loads(r["report"]),
            )
            for r in rows
        ]

    def last_passing(self, *, bundle: str, device: str, artifact: str) -> StoredCheck | None:
        """The baseline ``last``: the newest passing check of this bundle name, device and artifact."""
        rows = self._rows(
            "SELECT * FROM checks WHERE bundle=? AND device=? AND artifact=? AND passed=1 AND p50_ms IS NOT NULL "
            "ORDER BY created_at DESC, rowid DESC LIMIT 1",
            (bundle, device, artifact),
        )
        return rows[0] if rows else None

    def by_id(self, check_id: str, *, artifact: str | None = None) -> StoredCheck | None:
        """A CHECK_ID baseline: that report, or (a run id) that run's report for ``artifact``."""
        rows = self._rows("SELECT * FROM checks WHERE check_id=? OR run_id=? ORDER BY rowid", (check_id, check_id))
        if not rows:
            return None
        same = [r for r in rows if r.artifact == artifact]
        return same[0] if same else (rows[0] if len(rows) == 1 else None)

    def exists(self, check_id: str) -> bool:
        return bool(self._rows("SELECT * FROM checks WHERE check_id=? OR run_id=? LIMIT 1", (check_id, check_id)))

    def history(self, *, device: str | None = None, bundle: str | None = None, limit: int | None = None) -> list[StoredCheck]:
        """Stored checks, oldest first, filtered by device and/or bundle name."""
        where, args = [], []
        if device:
            where.append("device=?")
            args.append(device)
        if bundle:
            where.append("bundle=?")
            args.append(bundle)
        sql = "SELECT * FROM checks" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY created_at, rowid"
        rows = self._rows(sql, args)
        return rows[-limit:] if limit else rows


@dataclass(frozen=True)
class Trend:
    """p50 over time for one device + bundle + artifact."""

    device: str
    bundle: str
    artifact: str
    checks: int
    passed: int
    first_p50_ms: float | None
    last_p50_ms: float | None
    best_p50_ms: float | None

    @property
    def change_pct(self) -> float | None:
        if not self.first_p50_ms or self.last_p50_ms is None:
            return None
        return 100.0 * (self.last_p50_ms - self.first_p50_ms) / self.first_p50_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device, "bundle": self.bundle, "artifact": self.artifact, "checks": self.checks,
            "passed": self.passed, "first_p50_ms": self.first_p50_ms, "last_p50_ms": self.last_p50_ms,
            "best_p50_ms": self.best_p50_ms, "change_pct": self.change_pct,
        }


def trends(checks: Sequence[StoredCheck]) -> list[Trend]:
    groups: dict[tuple[str, str, str], list[StoredCheck]] = {}
    for c in checks:
        groups.setdefault((c.device, c.bundle, c.artifact), []).append(c)
    out = []
    for (device, bundle, artifact), rows in groups.items():
        p50s = [r.p50_ms for r in rows if r.p50_ms is not None]
        out.append(
            Trend(
                device=device, bundle=bundle, artifact=artifact, checks=len(rows),
                passed=sum(r.passed for r in rows), first_p50_ms=p50s[0] if p50s else None,
                last_p50_ms=p50s[-1] if p50s else None, best_p50_ms=min(p50s) if p50s else None,
            )
        )
    return out
