"""``edgetk run`` end to end as a user runs it: a real subprocess converts the digits CNN with the real
converters, deploys it to the ``local`` device (a private HOME; the runner under the device-side venv's python,
set through an inventory entry's ``python`` key) and checks it there. Tests not about the gates pass a huge
budget and ``--baseline none`` so timing noise cannot fail them."""

from __future__ import annotations

import json
import tomllib

import pytest

from tests.fixtures.cli import assert_clean_error, run_edgetk, run_edgetk_inproc
from tests.fixtures.home import new_home

NO_GATES = ("--budget-ms", "100000", "--baseline", "none")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, device_env, digits_keras, digits_calibration, digits_eval):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("run")
    home = root / "home"
    home.mkdir()
    inventory = root / "inv.toml"
    inventory.write_text(f'[devices.here]\nhost = "local"\npython = "{device_env.python}"\n')
    env = {"HOME": str(home), "EDGETK_STORE": str(root / "history.sqlite"), "EDGETK_CACHE_DIR": str(root / "cache")}
    args = (digits_keras, "--target", "generic-x86_64", "--format", "tflite", "--precision", "fp32",
            "--precision", "int8", "--calibration", digits_calibration, "--eval-data", digits_eval,
            "--inventory", inventory, "--device", "here", "--runs", "5")
    first = run_edgetk("run", *args, *NO_GATES, "--out", root / "bundle", "--json", env=env)
    return root, env, args, first


def test_run_converts_deploys_checks_and_records_the_config(setup):  # type: ignore[no-untyped-def]
    root, _env, _args, result = setup
    assert result.code == 0, result.stderr
    doc = result.json()
    assert doc["passed"] is True and doc["exit_code"] == 0 and doc["failed_stage"] is None
    assert doc["bundle"] == str(root / "bundle") and doc["cached"] is False
    manifest = json.loads((root / "bundle" / "manifest.json").read_text())
    assert doc["manifest"] == manifest
    (device,) = doc["devices"]
    assert device["device"] == "here" and device["ok"] and device["deploy"]["files_sent"] > 0
    assert sorted(r["artifact"] for r in device["reports"]) == ["model.fp32.tflite", "model.int8.tflite"]
    assert all(r["outputs_match"]["ok"] and r["runs"] == 5 and r["gates"]["passed"] for r in device["reports"])
    # progress on stderr, one stage after the other
    for stage in ("[1/3 convert] building tflite int8", "[2/3 deploy]", "sent", "[3/3 check]"):
        assert stage in result.stderr, (stage, result.stderr)
    assert result.stderr.index("[1/3 convert]") < result.stderr.index("[2/3 deploy]") < result.stderr.index(
        "[3/3 check]")
    config = tomllib.loads((root / "bundle" / "run.toml").read_text())
    assert config == doc["config"]
    assert config["device"] == ["here"] and config["precision"] == ["fp32", "int8"] and config["runs"] == 5
    assert config["budget-ms"] == 100000 and config["baseline"] == "none" and config["force"] is True
    assert config["inventory"].startswith("/") and config["calibration"].startswith("/")


def test_replay_from_the_bundle_config_with_a_flag_overriding_it(setup, tmp_path):  # type: ignore[no-untyped-def]
    root, env, _args, first = setup
    assert first.code == 0
    config = root / "bundle" / "run.toml"
    copy = tmp_path / "run.toml"
    copy.write_text(config.read_text())
    replay = run_edgetk("run", "--config", copy, "--runs", "3", "--json", cwd=tmp_path, env=env)
    assert replay.code == 0, replay.stderr
    doc = replay.json()
    assert doc["cached"] is True  # same source, data and options: the conversion cache answers
    assert doc["bundle"] == str(root / "bundle")
    assert [r["runs"] for r in doc["devices"][0]["reports"]] == [3, 3]  # the flag beats the file
    assert doc["config"]["runs"] == 3 and doc["config"]["precision"] == ["fp32", "int8"]


def test_plain_table_when_piped(setup):  # type: ignore[no-untyped-def]
    root, env, args, _first = setup
    text = run_edgetk("run", *args, *NO_GATES, "--out", root / "bundle", "--force", env=env)
    assert text.code == 0, text.stderr
    assert "\x1b[" not in text.stdout  # piped: no colour codes
    lines = text.stdout.splitlines()
    header = next(line for line in lines if line.startswith("artifact"))
    for column in ("precision", "size", "accuracy (float)", "host p50", "device", "p50", "p90", "load",
                   "peak mem", "gate"):
        assert column in header
    rows = [line for line in lines if line.startswith("model.")]
    assert len(rows) == 2 and all(row.rstrip().endswith("PASS") for row in rows)
    assert "(0.2" in rows[1] or "(0.3" in rows[1]  # int8 is about a quarter of fp32's size
    assert f"bundle: {root / 'bundle'}" in text.stdout


def test_check_stage_failure_exits_1_after_deploying(setup):  # type: ignore[no-untyped-def]
    root, env, args, _first = setup
    result = run_edgetk("run", *args, "--budget-ms", "0.000001", "--baseline", "none", "--out", root / "bundle",
                        "--force", "--json", env=env)
    assert result.code == 1, result.stderr
    doc = result.json()
    assert doc["failed_stage"] == "check" and doc["passed"] is False and doc["exit_code"] == 1
    assert "exceeds the budget" in doc["devices"][0]["error"]


def test_deploy_stage_failure_exits_4_and_skips_the_check(setup, tmp_path):  # type: ignore[no-untyped-def]
    root, env, args, _first = setup
    known = tmp_path / "known_hosts"
    known.write_text("")
    result = run_edgetk("run", *args[:-6], "--device", "pi@127.0.0.1:1", "--known-hosts", known, *NO_GATES,
                        "--out", root / "bundle", "--force", "--json", env=env)
    assert result.code == 4, result.stderr
    doc = result.json()
    assert doc["failed_stage"] == "deploy"
    (device,) = doc["devices"]
    assert device["ok"] is False and device["reports"] == [] and "refused" in device["error"]
    assert "[3/3 check]" not in result.stderr


def test_bad_input_fails_before_converting(tmp_path):  # type: ignore[no-untyped-def]
    env = new_home(tmp_path).env
    no_device = run_edgetk_inproc("run", "model.keras", env=env, cwd=tmp_path)
    assert_clean_error(no_device, 2, "no device given")
    missing = run_edgetk_inproc("run", tmp_path / "missing.keras", "--device", "local", env=env, cwd=tmp_path)
    assert_clean_error(missing, 2, "missing.keras")
    bad = tmp_path / "bad.toml"
    bad.write_text('source = "x.keras"\ndevise = ["local"]\n')
    typo = run_edgetk_inproc("run", "--config", bad, env=env, cwd=tmp_path)
    assert_clean_error(typo, 2, "unknown run option 'devise'", "did you mean 'device'")
    nothing = run_edgetk_inproc("run", "--device", "local", env=env, cwd=tmp_path)
    assert_clean_error(nothing, 2, "no source given")
    assert not (tmp_path / "bundles").exists()
