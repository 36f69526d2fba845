"""A history that several controllers share, on a real PostgreSQL server (tests/fixtures/postgres.py): two
``edgetk check`` processes with their own HOMEs (two laptops) writing at once lose nothing and a reader never
sees half a run; ``--baseline last`` comes from everyone's checks; ``history`` says who ran what where; a
database that is down or refuses the login costs the results nothing with ``--store-fallback``, and
``history sync`` brings them over once it is back."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.cli import REPO, run_edgetk

CHECK = ("--runs", "6", "--warmup", "1", "--budget-ms", "100000")  # >= 5 samples: the regression gate runs


def _controller(tmp_path: Path, user: str, python: str) -> tuple[dict[str, str], Path]:
    home = tmp_path / user
    home.mkdir()
    inventory = home / "devices.toml"
    inventory.write_text(f'[devices.box]\nhost = "local"\npython = "{python}"\n')
    env = {"HOME": str(home), "USER": user, "LOGNAME": user, "XDG_DATA_HOME": str(home / "data"),
           "EDGETK_STORE": ""}
    return env, inventory


def _popen(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    import os

    return subprocess.Popen([sys.executable, "-m", "toolkit.cli", *args], cwd=REPO, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_controllers_share_one_history(pg_url: str, tiny_bundle: Path, device_python: str,
                                           tmp_path: Path) -> None:
    import psycopg

    controllers = [_controller(tmp_path, user, device_python) for user in ("alice", "bob")]
    for env, inventory in controllers:
        deployed = run_edgetk("deploy", tiny_bundle, "--inventory", inventory, env=env)
        assert deployed.code == 0, deployed.stderr
    artifacts = 3  # tiny_bundle: tflite fp32 + int8 + onnx fp32: one run = 3 rows, written together
    seen: dict[str, int] = {}
    stop = threading.Event()

    def watch() -> None:  # a third party reading while both write: every run it sees is whole
        with psycopg.connect(pg_url.replace("postgresql://", "postgresql://", 1)) as conn:
            while not stop.is_set():
                try:
                    rows = conn.execute("SELECT run_id, count(*) FROM checks GROUP BY run_id").fetchall()
                except psycopg.errors.UndefinedTable:
                    conn.rollback()
                    rows = []
                conn.rollback()
                for run_id, count in rows:
                    seen[run_id] = max(seen.get(run_id, 0), count)
                    assert count == artifacts, f"run {run_id} seen with {count} of {artifacts} rows"
                time.sleep(0.02)

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    try:
        for _round in range(3):
            procs = [_popen(["check", str(tiny_bundle), "--inventory", str(inv), *CHECK, "--store", pg_url,
                             "--json"], env) for env, inv in controllers]
            outs = [p.communicate(timeout=600) for p in procs]
            for proc, (out, err) in zip(procs, outs):
                assert proc.returncode in (0, 1), err  # 1: a gate (e.g. a noisy regression) may fail; never 4
                assert pg_url.split("@")[0].split(":")[-1] not in out + err  # the password is never printed
                assert json.loads(out)["store"]["ok"] is True
    finally:
        stop.set()
        reader.join(timeout=10)
    assert len(seen) == 6 and set(seen.values()) == {artifacts}

    listed = run_edgetk("history", "--store", pg_url, "--json")
    assert listed.code == 0, listed.stderr
    rows = listed.json()
    assert len(rows) == 18
    assert {r["checked_by"] for r in rows} == {"alice", "bob"} and all(r["controller"] for r in rows)
    table = run_edgetk("history", "--store", pg_url)
    assert "alice@" in table.stdout and "bob@" in table.stdout

    # a third controller with no history of its own gets its regression baseline from the shared store
    env, inventory = _controller(tmp_path, "carol", device_python)
    assert run_edgetk("deploy", tiny_bundle, "--inventory", inventory, env=env).code == 0
    carol = run_edgetk("check", tiny_bundle, "--inventory", inventory, *CHECK, "--store", pg_url, "--json", env=env)
    assert carol.code in (0, 1), carol.stderr
    (device,) = carol.json()["devices"]
    regression = [r["gates"]["details"].get("regression") for r in device["reports"]]
    assert all(reg and reg.get("baseline_checks") for reg in regression), regression
    by = {r["check_id"]: r["checked_by"] for r in rows}
    assert {by[c] for reg in regression for c in reg["baseline_checks"]} == {"alice", "bob"}


def test_a_database_that_is_down_or_refuses_keeps_the_result(postgres_server, pg_url: str, tiny_deploy_bundle: Path,  # type: ignore[no-untyped-def]
                                                             device_python: str, tmp_path: Path) -> None:
    env, inventory = _controller(tmp_path, "dana", device_python)
    assert run_edgetk("deploy", tiny_deploy_bundle, "--inventory", inventory, env=env).code == 0
    database = pg_url.rsplit("/", 1)[1]
    wrong = postgres_server.url(database, password="Wr0ngPassw0rd")
    refused = run_edgetk("check", tiny_deploy_bundle, "--inventory", inventory, *CHECK, "--store", wrong, env=env)
    assert refused.code == 4 and "Traceback" not in refused.stderr
    assert "PASS model.fp32.onnx" in refused.stdout  # the check result is still printed
    assert f"postgresql://edgetk@127.0.0.1:{postgres_server.port}/{database}" in refused.stderr
    assert "NOT recorded" in refused.stderr and "Wr0ngPassw0rd" not in refused.stdout + refused.stderr

    postgres_server.stop()
    try:
        kept = run_edgetk("check", tiny_deploy_bundle, "--inventory", inventory, *CHECK, "--store", pg_url,
                          "--store-fallback", "--json", env=env)
        assert kept.code == 4, kept.stderr
        doc = kept.json()
        assert doc["devices"][0]["reports"][0]["outputs_match"]["ok"] is True
        assert doc["store"]["fallback_recorded"] == 1 and "history sync" in kept.stderr
        assert postgres_server.password not in kept.stdout + kept.stderr
    finally:
        postgres_server.start()
    synced = run_edgetk("history", "sync", "--store", pg_url, "--json", env=env)
    assert synced.code == 0, synced.stderr
    assert synced.json()["copied"] == 1
    rows = run_edgetk("history", "--store", pg_url, "--json", env=env).json()
    assert [r["checked_by"] for r in rows] == ["dana"]
    assert run_edgetk("history", "sync", "--store", pg_url, "--json", env=env).json()["copied"] == 0


def test_the_password_never_shows_even_with_debug(postgres_server, pg_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from urllib.parse import unquote

    secret = unquote(postgres_server.password)
    env = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"), "EDGETK_STORE": ""}
    fine = run_edgetk("--debug", "history", "--store", pg_url, "--json", env=env)  # engine, pool, migrations logged
    assert fine.code == 0, fine.stderr
    assert "alembic" in fine.stderr.lower() or "sqlalchemy" in fine.stderr.lower()  # debug logs really ran
    database = pg_url.rsplit("/", 1)[1]
    wrong_secret = "S3cretNotThis"
    refused = run_edgetk("--debug", "history", "--store", postgres_server.url(database, password=wrong_secret),
                         env=env)
    assert refused.code == 4 and "password authentication failed" in refused.stderr
    for result in (fine, refused):
        text = result.stdout + result.stderr
        assert secret not in text and postgres_server.password not in text and wrong_secret not in text
