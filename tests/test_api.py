"""The public Python API (toolkit.convert/deploy/check/run/inspect/...): real conversion, the real runner on
the ``local`` device (with the device-side venv's python), results equal to what the CLI prints."""

from __future__ import annotations

import importlib
import inspect as pyinspect
import json
import pkgutil

import pytest

import toolkit
from tests.fixtures.cli import run_edgetk
from tests.fixtures.runs import NO_GATES, private_home

VERBS = ("convert", "deploy", "check", "run", "inspect", "rollback", "status", "remove", "probe", "optimize",
         "quickstart")


def test_verbs_stay_functions_after_every_submodule_is_imported():
    for info in pkgutil.walk_packages(toolkit.__path__, "toolkit."):
        if info.name.startswith(("toolkit.device_side.", "toolkit.store.migrations")) or info.name.endswith("__main__"):
            continue  # scripts (the device-side runner, Alembic's migrations, python -m entry points), not the API
        try:
            importlib.import_module(info.name)
        except ImportError as exc:  # an optional extra that is not installed is fine; our own module is not
            assert not str(getattr(exc, "name", "")).startswith("toolkit"), exc
    for verb in VERBS:
        assert pyinspect.isfunction(getattr(toolkit, verb)), verb
    assert set(toolkit.__all__) >= {"convert", "deploy", "check", "run", "inspect"}


def test_api_functions_are_keyword_only_after_their_subject():
    from toolkit import api

    for name in ("convert", "deploy", "check", "run", "inspect", "rollback", "remove"):
        params = list(pyinspect.signature(getattr(api, name)).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert len(positional) <= 1, (name, positional)
    for name in ("status", "probe"):
        params = pyinspect.signature(getattr(api, name)).parameters.values()
        assert all(p.kind == p.KEYWORD_ONLY for p in params), name


def test_run_result_matches_the_contract(checked_bundle):
    result = checked_bundle.result
    assert result.passed and result.exit_code == 0 and result.failed_stage is None
    doc = result.to_dict()
    manifest = json.loads((checked_bundle.bundle / "manifest.json").read_text())
    assert doc["manifest"] == manifest
    assert [a["file"] for a in manifest["artifacts"]] == ["model.fp32.tflite", "model.int8.tflite"]
    (device,) = doc["devices"]
    assert device["device"] == "here" and device["ok"] and device["error"] is None
    assert device["deploy"]["files_sent"] == device["deploy"]["files_total"] > 0
    assert sorted(r["artifact"] for r in device["reports"]) == sorted(a["file"] for a in manifest["artifacts"])
    for report in device["reports"]:
        assert report["error"] is None and report["outputs_match"]["ok"] is True
        assert report["runs"] == 10 and 0 < report["latency_ms"]["p50"] <= report["latency_ms"]["p90"]
        assert report["runtime"]["name"] == "litert"
        assert report["check_id"]
    int8 = next(a for a in manifest["artifacts"] if a["precision"] == "int8")
    assert int8["verification"]["accuracy"] > 0.9  # a real model, really quantized
    assert int8["bytes"] < 0.5 * next(a for a in manifest["artifacts"] if a["precision"] == "fp32")["bytes"]
    json.dumps(doc)  # serialisable as it is


def test_check_status_inspect_and_rollback_errors(checked_bundle):
    from toolkit import api
    from toolkit.errors import UsageError

    second = checked_bundle.second
    assert second.passed and second.exit_code == 0
    assert {r.artifact for r in second.reports} == {"model.fp32.tflite", "model.int8.tflite"}
    assert set(second.to_dict()) == {"passed", "devices"}

    info = api.inspect(checked_bundle.bundle)
    assert isinstance(info, api.BundleInspection)
    assert [a.precision for a in info.artifacts] == ["fp32", "int8"]
    assert info.artifacts[1].quantized_ops > 0
    single = api.inspect(checked_bundle.bundle / "model.int8.tflite")
    assert single.to_dict() == info.artifacts[1].to_dict()

    with private_home(checked_bundle.home):
        state = api.status(devices=[checked_bundle.device])
        bundles = state.devices[0].data["bundles"]
        assert "digits-api" in bundles and bundles["digits-api"]["current"]
        back = api.rollback("digits-api", devices=[checked_bundle.device])  # only one version installed
    assert not back.passed and back.exit_code == 2 and back.devices[0].error
    with pytest.raises(UsageError, match="No device given"):
        api.check(checked_bundle.bundle)
    with pytest.raises(UsageError, match="does not exist"):
        api.inspect(checked_bundle.bundle / "nope.onnx")


def test_gate_failure_is_data_not_an_exception(checked_bundle):
    from toolkit import api

    with private_home(checked_bundle.home):
        report = api.check(checked_bundle.bundle, devices=[checked_bundle.device], runs=3, budget_ms=1e-6,
                           baseline="none", store=checked_bundle.store.with_name("other.sqlite"))
    assert not report.passed and report.exit_code == 1
    assert "exceeds the budget" in report.devices[0].error


def test_json_of_the_api_equals_the_cli(checked_bundle, tmp_path):
    from toolkit import api

    cli = run_edgetk("inspect", checked_bundle.bundle, "--json")
    assert cli.code == 0, cli.stderr
    assert cli.json() == api.inspect(checked_bundle.bundle).to_dict()
    env = {"HOME": str(checked_bundle.home)}
    inv = tmp_path / "inv.toml"
    inv.write_text(f'[devices.here]\nhost = "local"\npython = "{checked_bundle.device.python}"\n')
    status_cli = run_edgetk("status", "--inventory", inv, "--json", env=env)
    with private_home(checked_bundle.home):
        status_api = api.status(inventory=inv)
    assert status_cli.json() == status_api.to_dict()


def test_run_refuses_unknown_keywords_and_bad_devices_before_converting(tmp_path):
    from toolkit import api
    from toolkit.errors import UsageError

    with pytest.raises(TypeError, match="colour"):
        api.run("model.keras", devices=["local"], colour=True)
    with pytest.raises(UsageError, match="not a device spec"):
        api.run(tmp_path / "missing.keras", devices=["not a spec!"])
    assert not (tmp_path / "bundles").exists()
