"""The check history: record a run's reports in one transaction, read baselines, list and filter.

A :class:`Store` is cheap and thread-safe (SQLAlchemy's pool underneath); the engine, its migrations and its
connections are opened on first use, so naming a store that is down costs nothing until it is needed.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.model.records import JsonDict
from toolkit.store.location import StoreLocation, parse_location
from toolkit.model.device_records import CheckReport

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.sql import Select


def who_and_where() -> tuple[str | None, str | None]:
    """(login name, host name) of this controller, recorded with every check it stores."""
    try:
        user: str | None = getpass.getuser()
    except (KeyError, OSError):
        user = None
    return user, (socket.gethostname() or None)


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
    report: JsonDict
    checked_by: str | None = None
    controller: str | None = None

    def to_dict(self) -> JsonDict:
        """The report as ``history --json`` prints it: the check report plus where, when and by whom."""
        out = dict(self.report)
        out.update(
            check_id=self.check_id, run_id=self.run_id, device=self.device, bundle=self.bundle,
            version=self.version, created_at=self.created_at, passed=self.passed, checked_by=self.checked_by,
            controller=self.controller,
        )
        return out

    def row(self) -> JsonDict:
        """The table row (``history sync`` copies rows as they are)."""
        return {
            "check_id": self.check_id, "run_id": self.run_id, "created_at": self.created_at, "device": self.device,
            "bundle": self.bundle, "version": self.version, "artifact": self.artifact, "passed": int(self.passed),
            "p50_ms": self.p50_ms, "p90_ms": self.p90_ms, "report": json.dumps(self.report),
            "checked_by": self.checked_by, "controller": self.controller,
        }


def _insert_ignoring_duplicates(dialect: str) -> Any:  # Any: a dialect's own Insert class
    """INSERT ... ON CONFLICT (check_id) DO NOTHING, in the dialect's own words."""
    from toolkit.store.schema import checks

    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(checks).on_conflict_do_nothing(index_elements=["check_id"])
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(checks).on_conflict_do_nothing(index_elements=["check_id"])


class Store:
    """The history at ``location`` (a path, a URL, a StoreLocation, or None for the default)."""

    def __init__(self, location: StoreLocation | str | os.PathLike[str] | None = None) -> None:
        self.location = location if isinstance(location, StoreLocation) else parse_location(location)

    @property
    def path(self) -> Path | str:
        """The SQLite file, or the server URL without its password (for messages)."""
        return self.location.path if self.location.path is not None else self.location.display

    def __repr__(self) -> str:
        return f"Store({self.location.display!r})"

    def engine(self) -> Engine:
        """The database's SQLAlchemy engine (opened, and migrated, once per location): tables beside the
        history's own (selections.py) read and write through it."""
        from toolkit.store.engine import open_engine

        return open_engine(self.location)

    def failure(self, exc: BaseException) -> Exception:
        """The toolkit's error for a database failure ``exc`` on this store (it names the location)."""
        from toolkit.store.engine import store_error

        return store_error(self.location, exc)

    @staticmethod
    def new_run_id() -> str:
        return uuid.uuid4().hex[:12]

    def record(self, reports: Sequence[CheckReport], *, bundle: str, version: str, run_id: str,
               created_at: str | None = None, skip_existing: bool = False) -> list[str | None]:
        """Store one run's reports in one transaction (their ``check_id`` is used, or made); the ids, in order.
        ``created_at`` (ISO 8601 UTC) defaults to now; ``skip_existing`` keeps rows already stored (imports)."""
        now = created_at or datetime.now(UTC).isoformat(timespec="microseconds")
        user, host = who_and_where()
        rows: list[JsonDict] = []
        ids: list[str | None] = []
        for index, report in enumerate(reports):
            check_id = report.check_id or f"{run_id}-{index}"
            data = report.to_dict()
            data["check_id"] = check_id
            latency = report.latency_ms
            rows.append(StoredCheck(
                check_id=check_id, run_id=run_id, created_at=now, device=report.device, bundle=bundle,
                version=version, artifact=report.artifact, passed=report.gates.passed,
                p50_ms=latency.p50 if latency else None, p90_ms=latency.p90 if latency else None, report=data,
                checked_by=user, controller=host,
            ).row())
            ids.append(check_id)
        self.insert_rows(rows, skip_existing=skip_existing)
        return ids

    def insert_rows(self, rows: Sequence[JsonDict], *, skip_existing: bool = False) -> int:
        """Insert table rows in one transaction; ``skip_existing`` leaves rows whose check_id is stored already."""
        from sqlalchemy import insert, select
        from sqlalchemy.exc import SQLAlchemyError

        from toolkit.store.schema import checks

        if not rows:
            return 0
        try:
            engine = self.engine()
            with engine.begin() as conn:
                statement: Any = insert(checks)  # Any: sqlalchemy's or a dialect's Insert
                if skip_existing:
                    wanted = [r["check_id"] for r in rows]
                    have = set(conn.execute(select(checks.c.check_id).where(checks.c.check_id.in_(wanted))).scalars())
                    rows = [r for r in rows if r["check_id"] not in have]
                    statement = _insert_ignoring_duplicates(engine.dialect.name)  # another sync at the same time
                if rows:
                    conn.execute(statement, list(rows))
        except SQLAlchemyError as exc:
            raise self.failure(exc) from None
        return len(rows)

    def delete(self, check_ids: Sequence[str]) -> None:
        from sqlalchemy import delete
        from sqlalchemy.exc import SQLAlchemyError

        from toolkit.store.schema import checks

        try:
            with self.engine().begin() as conn:
                conn.execute(delete(checks).where(checks.c.check_id.in_(list(check_ids))))
        except SQLAlchemyError as exc:
            raise self.failure(exc) from None

    def _rows(self, query: Select[Any]) -> list[StoredCheck]:  # Any: sqlalchemy's row tuple type
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with self.engine().connect() as conn:
                rows = conn.execute(query).mappings().all()
        except SQLAlchemyError as exc:
            raise self.failure(exc) from None
        return [
            StoredCheck(
                check_id=r["check_id"], run_id=r["run_id"], created_at=r["created_at"], device=r["device"],
                bundle=r["bundle"], version=r["version"], artifact=r["artifact"], passed=bool(r["passed"]),
                p50_ms=r["p50_ms"], p90_ms=r["p90_ms"], report=json.loads(r["report"]),
                checked_by=r["checked_by"], controller=r["controller"],
            )
            for r in rows
        ]

    def last_passing(self, *, bundle: str, device: str, artifact: str) -> StoredCheck | None:
        """The baseline ``last``: the newest passing check of this bundle name, device and artifact."""
        from sqlalchemy import select

        from toolkit.store.schema import checks as t

        query = (
            select(t)
            .where(t.c.bundle == bundle, t.c.device == device, t.c.artifact == artifact, t.c.passed == 1,
                   t.c.p50_ms.is_not(None))
            .order_by(t.c.created_at.desc(), t.c.seq.desc())
            .limit(1)
        )
        rows = self._rows(query)
        return rows[0] if rows else None

    def by_id(self, check_id: str, *, artifact: str | None = None) -> StoredCheck | None:
        """A CHECK_ID baseline: that report, or (a run id) that run's report for ``artifact``."""
        from sqlalchemy import or_, select

        from toolkit.store.schema import checks as t

        rows = self._rows(select(t).where(or_(t.c.check_id == check_id, t.c.run_id == check_id)).order_by(t.c.seq))
        if not rows:
            return None
        same = [r for r in rows if r.artifact == artifact]
        return same[0] if same else (rows[0] if len(rows) == 1 else None)

    def exists(self, check_id: str) -> bool:
        from sqlalchemy import or_, select

        from toolkit.store.schema import checks as t

        query = select(t).where(or_(t.c.check_id == check_id, t.c.run_id == check_id)).limit(1)
        return bool(self._rows(query))

    def history(self, *, device: str | None = None, bundle: str | None = None,
                limit: int | None = None) -> list[StoredCheck]:
        """Stored checks, oldest first, filtered by device and/or bundle name (``limit``: the newest N)."""
        from sqlalchemy import select

        from toolkit.store.schema import checks as t

        query = select(t)
        if device:
            query = query.where(t.c.device == device)
        if bundle:
            query = query.where(t.c.bundle == bundle)
        if limit:
            newest = query.order_by(t.c.created_at.desc(), t.c.seq.desc()).limit(limit)
            return list(reversed(self._rows(newest)))
        return self._rows(query.order_by(t.c.created_at, t.c.seq))


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

    def to_dict(self) -> JsonDict:
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
