"""Open a store: one SQLAlchemy engine per location and process, its schema brought to ``HEAD`` on first use,
and every database failure turned into one plain error that names the location without its password.

Migrations run under a lock so that two controllers meeting a fresh or old database at once do not both
migrate it: PostgreSQL's transaction-scoped advisory lock, or ``flock`` on the SQLite file (SQLite's own locks
are POSIX record locks, which ``flock`` does not touch). On SQLite every transaction is a real ``BEGIN`` (the
driver's own transaction handling would commit DDL piecemeal), so a migration or a run's insert is all or
nothing.
"""

from __future__ import annotations

import fcntl
import logging
import threading
from typing import TYPE_CHECKING, Any

from toolkit.errors import DeviceError, UsageError
from toolkit.store.location import StoreLocation
from toolkit.store.schema import HEAD

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)
_ADVISORY_KEY = 0x6564_6774  # "edgt": the migration lock of every edgetk history on a server
_LEGACY = "legacy"
_lock = threading.Lock()
_engines: dict[str, Engine] = {}
_migrated: set[str] = set()


class StoreUnavailable(DeviceError):
    """The history database could not be reached or refused the login (exit 4, like a device)."""

    fix = (
        "Check the --store URL (or EDGETK_STORE), that the database server is up and that its login works; "
        "with --store-fallback results are kept locally and `edgetk history sync` sends them later."
    )


def store_error(location: StoreLocation, exc: BaseException) -> UsageError | StoreUnavailable:
    """A database exception -> one plain error without the password (a file problem is exit 2, a server 4)."""
    orig = getattr(exc, "orig", None) or exc
    reason = location.scrub(" ".join(str(orig).split()) or type(orig).__name__)[:300]
    if location.is_sqlite:
        return UsageError(
            f"Cannot open the check history {location.display} ({reason}).",
            hint="Pass --store PATH (or set EDGETK_STORE) to a writable file.",
        )
    from sqlalchemy.exc import DBAPIError, OperationalError

    if isinstance(exc, DBAPIError) and not isinstance(exc, OperationalError) and not exc.connection_invalidated:
        return StoreUnavailable(  # reached, but it refused the statement (permissions, a foreign schema)
            f"The check history at {location.display} refused the write or read ({reason}).",
            hint="Check that the login may create and write tables in that database.",
        )
    return StoreUnavailable(
        f"The check history at {location.display} is unavailable ({reason}).",
        hint="Start the database or fix the URL and login (password from PGPASSWORD or ~/.pgpass); with "
        "--store-fallback the results are kept locally for `edgetk history sync`.",
    )


def _sqlite_engine(location: StoreLocation) -> Engine:
    from sqlalchemy import create_engine, event

    assert location.path is not None
    try:
        location.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise store_error(location, exc) from None
    engine = create_engine(location.url, connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:  # Any: DB-API objects
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN")

    return engine


def _server_engine(location: StoreLocation) -> Engine:
    from sqlalchemy import create_engine

    try:
        import psycopg  # noqa: F401
    except ImportError:
        from toolkit.errors import MissingDependency

        raise MissingDependency("psycopg", extra="postgres", purpose="A PostgreSQL check history") from None
    # small pool: a fleet run writes from at most --parallel threads; connect_timeout bounds a dead server
    return create_engine(location.url, pool_size=4, max_overflow=8, pool_pre_ping=True,
                         connect_args={"connect_timeout": 10, "application_name": "edgetk"})


def _revision(conn: Connection) -> str | None:
    """The schema's Alembic revision, ``legacy`` for a pre-migration table, None for an empty database."""
    from sqlalchemy import inspect, text

    names = set(inspect(conn).get_table_names())
    if "alembic_version" in names:
        row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
        if row is not None:
            return str(row[0])
    return _LEGACY if "checks" in names else None


def _alembic_config(conn: Connection) -> Any:  # Any: alembic's Config (alembic is imported lazily)
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "toolkit.store:migrations")
    config.attributes["connection"] = conn
    return config


def _migrate(engine: Engine, location: StoreLocation) -> None:
    from alembic import command
    from sqlalchemy import text

    with engine.connect() as conn:
        current = _revision(conn)
        conn.rollback()
        if current == HEAD:
            return
    lock_file = open(location.path, "a+b") if location.path is not None else None  # noqa: SIM115
    try:
        if lock_file is not None:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        with engine.connect() as conn:
            if lock_file is None:
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_KEY})
            current = _revision(conn)  # another controller may have migrated while we waited
            if current != HEAD:
                log.info("migrating the check history %s from %s to %s", location.display, current, HEAD)
                config = _alembic_config(conn)
                if current == _LEGACY:
                    command.stamp(config, "0001")
                command.upgrade(config, "head")
            conn.commit()
    finally:
        if lock_file is not None:
            lock_file.close()  # releases the flock


def open_engine(location: StoreLocation) -> Engine:
    """The engine for ``location`` with its schema at ``HEAD`` (migrated once per process)."""
    from sqlalchemy.exc import SQLAlchemyError

    with _lock:
        engine = _engines.get(location.url)
        if engine is None:
            engine = _sqlite_engine(location) if location.is_sqlite else _server_engine(location)
            _engines[location.url] = engine
        if location.url not in _migrated:
            try:
                _migrate(engine, location)
            except (SQLAlchemyError, OSError) as exc:
                raise store_error(location, exc) from None
            _migrated.add(location.url)
    return engine


def forget_engines() -> None:
    """Close every pooled connection (tests that stop a server; a forked child)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _migrated.clear()
