"""A history that several controllers share: a write-order column and who/where ran each check.

``seq`` replaces SQLite's implicit rowid as the tie-breaker between rows of one run (PostgreSQL has no rowid),
so the table is rebuilt: a new table, every old row copied in its old order (created_at, then rowid), the old
table dropped, the new one renamed. Old rows get NULL ``checked_by``/``controller`` (unknown).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_COPIED = "check_id, run_id, created_at, device, bundle, version, artifact, passed, p50_ms, p90_ms, report"


def upgrade() -> None:
    op.create_table(
        "checks_v2",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("check_id", sa.Text, nullable=False, unique=True),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("device", sa.Text, nullable=False),
        sa.Column("bundle", sa.Text, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("artifact", sa.Text, nullable=False),
        sa.Column("passed", sa.Integer, nullable=False),
        sa.Column("p50_ms", sa.Float),
        sa.Column("p90_ms", sa.Float),
        sa.Column("report", sa.Text, nullable=False),
        sa.Column("checked_by", sa.Text),
        sa.Column("controller", sa.Text),
    )
    order = "created_at, rowid" if op.get_bind().dialect.name == "sqlite" else "created_at, check_id"
    op.execute(f"INSERT INTO checks_v2 ({_COPIED}) SELECT {_COPIED} FROM checks ORDER BY {order}")
    op.drop_index("checks_lookup", table_name="checks")
    op.drop_table("checks")
    op.rename_table("checks_v2", "checks")
    op.create_index("checks_lookup", "checks", ["bundle", "device", "artifact", "created_at"])
    op.create_index("checks_run", "checks", ["run_id"])


def downgrade() -> None:
    raise NotImplementedError("the history is never downgraded: keep a copy of the file instead")
