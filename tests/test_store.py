"""The SQLite check history: record, baselines (last passing / by id), filters, trends, default location."""

from __future__ import annotations

from pathlib import Path

from toolkit.store import Store, default_store_path, trends
from toolkit.model.device_records import CheckReport, GateResult, LatencyStats


def _report(device: str, artifact: str, p50: float, passed: bool = True) -> CheckReport:
    lat = LatencyStats(mean=p50, std=0.1, min=p50 * 0.9, p50=p50, p90=p50 * 1.2, p99=p50 * 1.5, max=p50 * 2)
    return CheckReport(
        device=device, artifact=artifact, runtime={"name": "onnxruntime", "version": "1.31.1"}, threads=2,
        load_ms=1.0, first_inference_ms=0.5, latency_ms=lat, runs=10, warmup=1, peak_rss_mb=50.0,
        outputs_match={"max_abs_error": 0.0, "top1_agreement": 1.0, "ok": True}, environment={"arch": "x86_64"},
        gates=GateResult(passed, () if passed else ("slow",)),
    )


def test_record_baselines_history_trends(tmp_path: Path) -> None:
    store = Store(tmp_path / "sub" / "h.sqlite")
    run1 = store.new_run_id()
    ids1 = store.record([_report("pi", "a.tflite", 10.0), _report("pi", "b.onnx", 20.0)], bundle="m", version="v1",
                        run_id=run1)
    assert ids1 == [f"{run1}-0", f"{run1}-1"]
    store.record([_report("pi", "a.tflite", 12.0, passed=False)], bundle="m", version="v2", run_id="r2")
    store.record([_report("jetson", "a.tflite", 3.0)], bundle="m", version="v2", run_id="r3")

    last = store.last_passing(bundle="m", device="pi", artifact="a.tflite")
    assert last is not None and last.p50_ms == 10.0 and last.check_id == ids1[0]  # the failed one is skipped
    assert store.last_passing(bundle="other", device="pi", artifact="a.tflite") is None
    assert store.by_id(run1, artifact="b.onnx").p50_ms == 20.0  # type: ignore[union-attr]
    assert store.by_id(ids1[1]).artifact == "b.onnx"  # type: ignore[union-attr]
    assert store.by_id("nope") is None

    rows = store.history(device="pi")
    assert [r.p50_ms for r in rows] == [10.0, 20.0, 12.0]
    assert store.history(bundle="m", limit=1)[0].device == "jetson"
    doc = rows[0].to_dict()
    assert doc["device"] == "pi" and doc["bundle"] == "m" and doc["created_at"] and doc["check_id"] == ids1[0]
    assert doc["latency_ms"]["p50"] == 10.0

    (trend,) = [t for t in trends(rows) if t.artifact == "a.tflite"]
    assert (trend.checks, trend.passed, trend.first_p50_ms, trend.last_p50_ms) == (2, 1, 10.0, 12.0)
    assert round(trend.change_pct or 0, 6) == 20.0


def test_default_location(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("EDGETK_STORE", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == tmp_path / "xdg" / "edgetk" / "history.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_store_path() == tmp_path / ".local" / "share" / "edgetk" / "history.sqlite"
    monkeypatch.setenv("EDGETK_STORE", str(tmp_path / "x.sqlite"))
    assert default_store_path() == tmp_path / "x.sqlite"


# ------------------------------------------------------------------ migrations, locations, a shared server

import sqlite3  # noqa: E402

import pytest  # noqa: E402

from toolkit.errors import UsageError  # noqa: E402
from toolkit.store import parse_location  # noqa: E402
from toolkit.store.engine import StoreUnavailable, forget_engines  # noqa: E402

LEGACY_DUMP = Path(__file__).parent / "fixtures" / "data" / "history_v1.sql"


def test_a_history_written_before_migrations_is_upgraded_without_losing_a_row(tmp_path: Path) -> None:
    # history_v1.sql is `.dump` of a file that the sqlite3-only store (before Alembic) wrote: 4 checks, 3 runs
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(LEGACY_DUMP.read_text())
    store = Store(path)
    rows = store.history()
    assert [r.check_id for r in rows] == ["legacyrun001-0", "legacyrun001-1", "legacyrun002-0", "legacyrun003-0"]
    assert [r.p50_ms for r in rows] == [10.0, 5.0, 13.0, 3.0]
    assert rows[0].report["latency_ms"]["p50"] == 10.0 and rows[0].checked_by is None
    last = store.last_passing(bundle="digits", device="pi", artifact="model.fp32.onnx")
    assert last is not None and last.check_id == "legacyrun001-0"  # the later failing run is not a baseline
    (new_id,) = store.record([_report("pi", "model.fp32.onnx", 9.0)], bundle="digits", version="v3", run_id="r9")
    again = Store(path).history(device="pi")
    assert [r.check_id for r in again][-1] == new_id and again[-1].checked_by and again[-1].controller
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("0003",)]
        assert db.execute("SELECT count(*) FROM checks").fetchone() == (5,)
        assert db.execute("SELECT count(*) FROM selections").fetchone() == (0,)  # 0003: the devices' selections
    from toolkit.store.selections import latest_selections, record_selection

    record_selection(store, {"artifact": "model.fp32.onnx", "version": "v3", "pinned": False, "p50_ms": 9.0},
                     device="pi", bundle="digits", run_id="r9")
    assert [(s["device"], s["artifact"]) for s in latest_selections(Store(path), bundle="digits")] == [
        ("pi", "model.fp32.onnx")]


def test_head_constant_is_alembics_head() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from toolkit.store.schema import HEAD

    config = Config()
    config.set_main_option("script_location", "toolkit.store:migrations")
    assert ScriptDirectory.from_config(config).get_current_head() == HEAD


def test_locations_and_redaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGETK_STORE", "postgresql://ci:s3cr%40t@db.lab:5433/edgetk")
    env = parse_location(None)
    assert env.display == "postgresql://ci@db.lab:5433/edgetk" and not env.is_sqlite
    assert "s3cr" not in repr(env) and "s3cr" not in str(env)
    assert env.scrub("auth failed for s3cr@t and s3cr%40t") == "auth failed for *** and ***"
    assert parse_location(tmp_path / "h.sqlite").path == tmp_path / "h.sqlite"
    assert parse_location(f"sqlite:///{tmp_path}/x.sqlite").path == tmp_path / "x.sqlite"
    with pytest.raises(UsageError, match="not supported") as info:
        parse_location("mysql://u:hunter2@h/db")
    assert "hunter2" not in str(info.value)


def test_unwritable_file_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="Cannot open the check history"):
        Store(blocker / "h.sqlite").history()


def test_record_and_baselines_on_postgresql(pg_url: str) -> None:
    store = Store(pg_url)
    run = store.new_run_id()
    ids = store.record([_report("pi", "a.tflite", 10.0), _report("pi", "b.onnx", 20.0)], bundle="m", version="v1",
                       run_id=run)
    store.record([_report("pi", "a.tflite", 12.0, passed=False)], bundle="m", version="v2", run_id="r2")
    other = Store(pg_url)  # a second controller sees the same history
    last = other.last_passing(bundle="m", device="pi", artifact="a.tflite")
    assert last is not None and last.check_id == ids[0] and last.checked_by
    assert [r.p50_ms for r in other.history(device="pi")] == [10.0, 20.0, 12.0]
    assert other.by_id(run, artifact="b.onnx").p50_ms == 20.0  # type: ignore[union-attr]
    assert other.history(limit=1)[0].run_id == "r2"


def test_a_server_that_is_down_or_refuses_the_login_is_one_plain_error(postgres_server, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    database = pg_url.rsplit("/", 1)[1]
    wrong = postgres_server.url(database, password="not-the-password")
    with pytest.raises(StoreUnavailable) as info:
        Store(wrong).history()
    message = str(info.value)
    assert f"postgresql://edgetk@127.0.0.1:{postgres_server.port}/{database}" in message
    assert "password authentication failed" in message
    assert "not-the-password" not in message and info.value.exit_code == 4

    store = Store(pg_url)
    store.history()
    postgres_server.stop()
    try:
        forget_engines()
        with pytest.raises(StoreUnavailable) as down:
            Store(pg_url).last_passing(bundle="m", device="pi", artifact="a")
        assert postgres_server.password not in str(down.value) and "unavailable" in str(down.value)
    finally:
        postgres_server.start()
        forget_engines()


def test_fallback_keeps_results_and_sync_copies_them_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          postgres_server, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    from toolkit.store.guard import GuardedStore, sync

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    database = pg_url.rsplit("/", 1)[1]
    refused = postgres_server.url(database, password="wrong")
    lost = GuardedStore(refused)
    assert lost.record([_report("pi", "a", 1.0)], bundle="m", version="v", run_id="x") == [None]
    status = lost.status()
    assert not status.ok and status.not_recorded == 1 and "NOT recorded" in " ".join(status.lines())

    kept = GuardedStore(refused, fallback=True)
    assert kept.last_passing(bundle="m", device="pi", artifact="a") is None
    ids = kept.record([_report("pi", "a", 1.0), _report("pi", "b", 2.0)], bundle="m", version="v", run_id="y")
    status = kept.status()
    assert ids == ["y-0", "y-1"] and status.fallback_recorded == 2 and status.baseline_missing
    assert status.fallback == str(tmp_path / "xdg" / "edgetk" / "unsynced.sqlite")
    assert "wrong" not in " ".join(status.lines())

    shared = Store(pg_url)
    first = sync(shared)
    assert (first.copied, first.already_there) == (2, 0)
    assert [r.check_id for r in shared.history()] == ["y-0", "y-1"]
    assert sync(shared).copied == 0  # the fallback file was emptied
