"""``edgetk targets list|show`` as a user runs it: a real subprocess, exit codes, one JSON document on stdout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.cli import CliResult, assert_clean_error

pytestmark = pytest.mark.fast

EdgeTk = Callable[..., CliResult]

SHIPPED = {
    "raspberry-pi-3b", "raspberry-pi-4", "raspberry-pi-5", "raspberry-pi-zero-2w", "jetson-nano",
    "jetson-orin-nano", "coral-usb", "coral-dev-board", "generic-aarch64", "generic-x86_64",
}
CLEAN_ENV = {"EDGETK_TARGETS_PATH": ""}


def test_list_table(edgetk: EdgeTk) -> None:
    result = edgetk("targets", "list", env=CLEAN_ENV)
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ARCH", "PREFERRED", "RECIPE", "BUDGET", "SOURCE"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == SHIPPED
    assert "onnx int8 (U8S8 qdq minmax reduce_range)" in rows["generic-x86_64"] and "20 ms" in rows["generic-x86_64"]
    assert "tflite int8 (uint8 io)" in rows["coral-usb"]
    assert rows["jetson-nano"].rstrip().endswith("shipped")


def test_list_json_is_one_document(edgetk: EdgeTk) -> None:
    result = edgetk("targets", "list", "--json", env=CLEAN_ENV)
    assert result.code == 0, result.stderr
    rows = result.json()
    assert {r["name"] for r in rows} == SHIPPED
    for row in rows:
        assert {"name", "arch", "source", "preferred_recipe", "latency_budget_ms", "path"} <= set(row)
        assert row["source"] == "shipped"
    pi4 = next(r for r in rows if r["name"] == "raspberry-pi-4")
    assert (pi4["arch"], pi4["preferred_recipe"], pi4["latency_budget_ms"]) == ("aarch64", "tflite int8 (int8 io)",
                                                                                80.0)


def test_show_json_is_the_resolved_profile(edgetk: EdgeTk) -> None:
    result = edgetk("targets", "show", "jetson-nano", "--json", env=CLEAN_ENV)
    assert result.code == 0, result.stderr
    data = result.json()
    assert data["name"] == "jetson-nano" and data["source"] == "shipped" and data["origin"] == "shipped"
    assert data["path"].endswith("targets/jetson-nano.toml")
    assert data["python"] == "3.6" and data["max_onnx_opset"] == 13 and data["cpu"] == {"cores": 4,
                                                                                         "model": "Cortex-A57"}
    assert data["recipes"][0]["precision"] == "fp16" and data["recipes"][0]["format"] == "onnx"
    assert data["recipes"][0]["execution_providers"][0] == "TensorrtExecutionProvider"
    assert data["provider_options"]["TensorrtExecutionProvider"]["trt_fp16_enable"] is True
    assert data["fallback"] == ["fp16", "fp32"] and data["tolerance"]["min_cosine"] == 0.999
    assert data["runtimes"] == [{"name": "onnxruntime", "min_version": "1.8", "max_version": "1.11",
                                 "note": data["runtimes"][0]["note"]}]


def test_show_text(edgetk: EdgeTk) -> None:
    result = edgetk("targets", "show", "coral-usb", env=CLEAN_ENV)
    assert result.code == 0, result.stderr
    assert "source:            shipped" in result.stdout
    assert "1. tflite int8 (uint8 io)" in result.stdout
    assert "libedgetpu.so.1" in result.stdout and "https://coral.ai/docs/edgetpu/models-intro/" in result.stdout


def test_user_profile_wins_and_show_says_where_it_came_from(edgetk: EdgeTk, tmp_path: Path) -> None:
    (tmp_path / "raspberry-pi-4.toml").write_text('extends = "raspberry-pi-4"\nlatency_budget_ms = 42\n')
    listed = edgetk("targets", "list", "--json", "--targets-dir", tmp_path, env=CLEAN_ENV)
    assert listed.code == 0, listed.stderr
    pi4 = next(r for r in listed.json() if r["name"] == "raspberry-pi-4")
    assert pi4["source"] == "user" and pi4["latency_budget_ms"] == 42
    assert pi4["path"] == str(tmp_path / "raspberry-pi-4.toml")

    shown = edgetk("targets", "show", "raspberry-pi-4", "--targets-dir", tmp_path, env=CLEAN_ENV)
    assert shown.code == 0, shown.stderr
    assert f"user ({tmp_path / 'raspberry-pi-4.toml'}), extends raspberry-pi-4" in shown.stdout
    assert "latency budget:    42 ms" in shown.stdout

    via_env = edgetk("targets", "show", "raspberry-pi-4", "--json", env={"EDGETK_TARGETS_PATH": str(tmp_path)})
    assert via_env.code == 0, via_env.stderr
    assert via_env.json()["source"] == "user" and via_env.json()["latency_budget_ms"] == 42


def test_unknown_name_exits_2_with_did_you_mean(edgetk: EdgeTk) -> None:
    result = edgetk("targets", "show", "raspbery-pi-5", env=CLEAN_ENV)
    assert_clean_error(result, 2, "unknown target 'raspbery-pi-5'", "did you mean 'raspberry-pi-5'?",
                       "edgetk targets list")
    assert result.stdout == ""


def test_bad_user_profile_exits_2_naming_file_and_key(edgetk: EdgeTk, tmp_path: Path) -> None:
    bad = tmp_path / "my-board.toml"
    bad.write_text('extends = "generic-aarch64"\nthread = 2\n')
    result = edgetk("targets", "list", "--json", "--targets-dir", tmp_path, env=CLEAN_ENV)
    assert_clean_error(result, 2, str(bad), "key 'thread'", "did you mean 'threads'?")
    doc = result.json()  # with --json the error is also the one document on stdout
    assert doc["passed"] is False and doc["exit_code"] == 2 and doc["error"]["kind"] == "UsageError"
    assert str(bad) in doc["error"]["message"] and "'thread'" in doc["error"]["message"]
