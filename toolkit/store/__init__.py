"""History of every check: the baselines for regression gates and the trends for ``edgetk history``.

Through SQLAlchemy Core with Alembic migrations (run on first use, versioned, under a lock), so one code path
serves the embedded default, a SQLite file, and a history that a team shares on PostgreSQL. A store's failures
become one plain error (:mod:`.engine`: exit 2 for a file, 4 for a server that is down or refuses the login);
:class:`~.guard.GuardedStore` lets a check keep its result when the database is down (``--store-fallback``).
Nothing heavy is imported here: SQLAlchemy loads when a store is first used.
"""

from __future__ import annotations

from toolkit.store.history import Store, StoredCheck, Trend, trends, who_and_where
from toolkit.store.location import StoreLocation, default_store_path, fallback_store_path, parse_location

__all__ = [
    "Store", "StoreLocation", "StoredCheck", "Trend", "default_store_path", "fallback_store_path",
    "parse_location", "trends", "who_and_where",
]
