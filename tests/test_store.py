"""The SQLite check history: record, baselines (last passing / by id), filters, trends, default location."""

from __future__ import annotations

from pathlib import Path

from toolkit.store import Store, default_store_path, trends
from toolkit.types import CheckReport, GateResult, LatencyStats


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
