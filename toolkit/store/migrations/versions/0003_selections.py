"""The device's selection: which artifact each device runs, recorded with the check run that decided it.

One row per device per check run (``toolkit.checks.selection``): the selected artifact (NULL when nothing passed),
why, whether the user pinned it, and the selection document (every artifact's p50 on the device and why the
others were not selected). Older histories upgrade by gaining the empty table; their checks are untouched.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "selections",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("device", sa.Text, nullable=False),
        sa.Column("bundle", sa.Text, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("artifact", sa.Text),
        sa.Column("pinned", sa.Integer, nullable=False),
        sa.Column("selection", sa.Text, nullable=False),
    )
    op.create_index("selections_lookup", "selections", ["bundle", "device", "created_at"])


def downgrade() -> None:
    raise NotImplementedError("the history is never downgraded: keep a copy of the file instead")
