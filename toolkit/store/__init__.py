"""History of every check: the baselines for regression gates and the trends for ``edgetk history``.

Through SQLAlchemy Core with Alembic migrations (run on first use, versioned, under a lock), so one code path
serves the embedded default, a SQLite file, and a history that a team shares on PostgreSQL:

- ``location``: ``--store PATH|URL`` / ``$EDGETK_STORE`` / the default file, and the password-free display form;
- ``schema``: the tables at the newest migration; ``migrations/``: the Alembic scripts (shipped in the wheel);
- ``engine``: one engine per location, migrated once per process; failures -> one plain error (exit 2 for a
  file, 4 for a server that is down or refuses the login);
- ``history``: :class:`Store` (record a run in one transaction, baselines, listing) and trends;
- ``guard``: :class:`GuardedStore` (a check keeps its result when the database is down; ``--store-fallback``)
  and :func:`sync` (``edgetk history sync``).

Nothing heavy is imported here: SQLAlchemy loads when a store is first used.
"""

from __future__ import annotations

from toolkit.store.history import Store, StoredCheck, Trend, trends, who_and_where
from toolkit.store.location import StoreLocation, default_store_path, fallback_store_path, parse_location

__all__ = [
    "Store", "StoreLocation", "StoredCheck", "Trend", "default_store_path", "fallback_store_path",
    "parse_location", "trends", "who_and_where",
]
