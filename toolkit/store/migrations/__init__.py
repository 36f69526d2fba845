"""Alembic migrations of the check history (run on first use by ``toolkit.store.engine``)."""
