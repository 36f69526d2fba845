"""The first schema: one ``checks`` table, exactly as edgetk 0.x created it with sqlite3 (no Alembic then).

A history file written before migrations existed has this table and no ``alembic_version``: it is stamped
``0001`` and upgraded from here, row for row.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checks",
        sa.Column("check_id", sa.Text, primary_key=True),
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
    )
    op.create_index("checks_lookup", "checks", ["bundle", "device", "artifact", "created_at"])


def downgrade() -> None:
    op.drop_table("checks")
