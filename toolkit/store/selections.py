"""The devices' selections in the history (table ``selections``, migration ``0003``): record one, read the
newest per device. The selection document is :meth:`toolkit.checks.selection.Selection.to_dict`, stored whole."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from toolkit.model.records import JsonDict, JsonObject
from toolkit.store.history import Store


def record_selection(store: Store, selection: JsonObject, *, device: str, bundle: str, run_id: str) -> None:
    """Store one device's selection (``Selection.to_dict()``) of one check run."""
    from sqlalchemy import insert
    from sqlalchemy.exc import SQLAlchemyError

    from toolkit.store.schema import selections as t

    row = {
        "run_id": run_id, "created_at": datetime.now(UTC).isoformat(timespec="microseconds"), "device": device,
        "bundle": bundle, "version": str(selection.get("version") or ""), "artifact": selection.get("artifact"),
        "pinned": int(bool(selection.get("pinned"))), "selection": json.dumps(dict(selection)),
    }
    try:
        with store.engine().begin() as conn:
            conn.execute(insert(t), [row])
    except SQLAlchemyError as exc:
        raise store.failure(exc) from None


def latest_selections(store: Store, *, bundle: str | None = None, device: str | None = None) -> list[JsonDict]:
    """The newest selection of every (bundle, device), oldest device name first: each the stored document plus
    ``device``, ``bundle`` and ``recorded_at``."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from toolkit.store.schema import selections as t

    query = select(t)
    if bundle:
        query = query.where(t.c.bundle == bundle)
    if device:
        query = query.where(t.c.device == device)
    try:
        with store.engine().connect() as conn:
            rows = conn.execute(query.order_by(t.c.created_at, t.c.seq)).mappings().all()
    except SQLAlchemyError as exc:
        raise store.failure(exc) from None
    newest: dict[tuple[str, str], JsonDict] = {}
    for r in rows:
        doc = json.loads(r["selection"])
        doc.update({"device": r["device"], "bundle": r["bundle"], "recorded_at": r["created_at"]})
        newest[(r["bundle"], r["device"])] = doc
    return [newest[key] for key in sorted(newest)]
