"""Alembic environment: always called in-process by ``toolkit.store.engine`` with an open connection
(``config.attributes["connection"]``), inside the caller's transaction and lock. There is no alembic.ini."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, transactional_ddl=True, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
