"""The history's tables as SQLAlchemy Core objects: the schema at the newest migration (``HEAD``).

One row per check report (one artifact on one device in one check run). The full report JSON is kept, with
the columns that baselines and filters need beside it. ``seq`` orders rows the way they were written (SQLite's
rowid did that before ``0002``; a server needs a real column); ``checked_by``/``controller`` say who ran the
check and on which machine, so a shared history shows everyone's runs. ``selections`` (``0003``): one row per
device per check run, the artifact the device selected (toolkit.checks.selection) and the document that decided it. Changing a table here needs a new
migration in ``migrations/versions`` and a new ``HEAD``.
"""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, MetaData, Table, Text

HEAD = "0003"

metadata = MetaData()

checks = Table(
    "checks",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("check_id", Text, nullable=False, unique=True),
    Column("run_id", Text, nullable=False),
    Column("created_at", Text, nullable=False),  # ISO 8601 UTC with microseconds: sorts as text
    Column("device", Text, nullable=False),
    Column("bundle", Text, nullable=False),
    Column("version", Text, nullable=False),
    Column("artifact", Text, nullable=False),
    Column("passed", Integer, nullable=False),
    Column("p50_ms", Float),
    Column("p90_ms", Float),
    Column("report", Text, nullable=False),
    Column("checked_by", Text),
    Column("controller", Text),
    Index("checks_lookup", "bundle", "device", "artifact", "created_at"),
    Index("checks_run", "run_id"),
)

selections = Table(
    "selections",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Text, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("device", Text, nullable=False),
    Column("bundle", Text, nullable=False),
    Column("version", Text, nullable=False),
    Column("artifact", Text),
    Column("pinned", Integer, nullable=False),
    Column("selection", Text, nullable=False),
    Index("selections_lookup", "bundle", "device", "created_at"),
)
