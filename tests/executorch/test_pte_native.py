"""The .pte artifacts through the native runner (toolkit/device_side/pte_runner.cpp): a device env with executorch
and NO torch (``import torch`` fails there, asserted), the runner built by the toolkit against the executorch
1.5.1 wheel's libraries and put beside them as setup does. Each gate's input as with the Python binding: golden
outputs, the bundled self-check (the .bpte read without flatbuffers or torch), the delegated share, ETDump
per-operator times, the device's selection; and the version lock: a program from another executorch release is
refused with the release to install."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.executorch.test_pte_device import NO_GATES, PTE
from tests.fixtures.cli import run_edgetk
from tests.fixtures.device_envs import DeviceEnv
from tests.fixtures.home import Home, new_home
from tests.fixtures.pte import EVAL_SAMPLES, needs_executorch
from tests.runner.test_runner import check, reports

pytestmark = needs_executorch


def assert_no_torch(python: Path | str, via: tuple[str, ...] = ()) -> None:
    proc = subprocess.run([*via, str(python), "-c", "import torch"], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr, proc.stderr[-500:]


def assert_native(report: dict[str, Any], runs: int | None = None) -> None:
    """Measured by the native runner, its numbers checked twice (golden outputs, bundled program)."""
    assert report["error"] is None, report["error"]
    runtime = report["runtime"]
    assert runtime["name"] == "executorch" and runtime["version"] == "1.5.1" and runtime["path"] == "native", runtime
    assert runtime["native"]["executorch"] == "1.5.1" and "XnnpackBackend" in runtime["backends"], runtime
    if runs is not None:
        assert report["runs"] == runs
    assert report["load_ms"] > 0 and report["first_inference_ms"] > 0
    assert 0 < report["latency_ms"]["min"] <= report["latency_ms"]["p50"] <= report["latency_ms"]["max"]
    # the program's own process: a few MB, where the Python binding's (torch) is hundreds
    assert 1 < report["peak_rss_mb"] < 60, report["peak_rss_mb"]
    match = report["outputs_match"]
    assert match["ok"] is True and match["max_abs_error"] < 1e-4, match
    bundled = report["bundled_check"]
    assert bundled["ok"] is True and bundled["cases"] == 4 and not bundled["failed"], bundled
    assert bundled["path"] == "native", bundled
    placement = report["placement"]
    assert placement["intended"] == "XNNPACK" and placement["nodes_total"] >= placement["nodes_on_intended"] > 0


def test_native_runner_measures_pte_without_torch(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                                  executorch_native_env: DeviceEnv) -> None:
    bundle, manifest = pte_digits_bundle
    assert_no_torch(executorch_native_env.python)
    records = {a["file"]: a for a in manifest["artifacts"]}
    assert all(records[name]["pte"]["executorch_version"] == "1.5.1" for name in PTE)  # the exporter's, recorded
    doc = check(executorch_native_env, bundle, "--runs", "20", *(a for name in PTE for a in ("--artifact", name)),
                "--profile")
    found = reports(doc)
    for name in PTE:
        assert_native(found[name], 20)
        profile = found[name]["profile"]
        assert profile["available"] is True and profile["source"] == "etdump", profile
        names = [op["name"] for op in profile["top"]]
        assert "DELEGATE_CALL" in names and all(op["calls"] > 0 and op["total_ms"] >= 0 for op in profile["top"])
        print(name, found[name]["latency_ms"]["p50"], "ms p50,", found[name]["peak_rss_mb"], "MB;", names[:4])


def test_a_wrong_expectation_fails_the_native_bundled_check(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                                            executorch_native_env: DeviceEnv, tmp_path: Path) -> None:
    """Not vacuous: the same bundled program at a limit below the INT8 artifact's own error fails."""
    bundle = _edited(pte_digits_bundle[0], tmp_path, "model.int8.pte", bundled_atol=1e-7)
    report = reports(check(executorch_native_env, bundle, "--runs", "3", "--artifact", "model.int8.pte"))
    bundled = report["model.int8.pte"]["bundled_check"]
    assert bundled["ok"] is False and bundled["failed"] and bundled["path"] == "native", bundled
    assert report["model.int8.pte"]["outputs_match"]["ok"] is False


def test_another_executorch_release_is_refused(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                               executorch_native_env: DeviceEnv, tmp_path: Path) -> None:
    """The version lock: a program recorded as exported by another release is refused before loading, with the
    release to install named, never as a damaged file."""
    bundle = _edited(pte_digits_bundle[0], tmp_path, "model.fp32.pte", executorch_version="1.4.0")
    report = reports(check(executorch_native_env, bundle, "--runs", "3"))
    error = report["model.fp32.pte"]["error"]
    assert error["kind"] == "missing_runtime", error
    assert "exported by executorch 1.4.0" in error["message"] and "has executorch 1.5.1" in error["message"], error
    assert "executorch==1.4.0" in error["hint"] and "devices setup" in error["hint"], error
    assert_native(report["model.int8.pte"])  # its neighbour, of this release, still runs


def test_deploy_refuses_another_executorch_release_before_pushing(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                                                   tmp_path: Path) -> None:
    """The version lock on the host: `local`'s runner Python is this venv's, with executorch 1.5.1. A bundle whose
    every artifact is a .pte of 1.4.0 is refused before anything is sent, with the device's own words
    (missing_runtime: the release to install); with an ONNX artifact beside them, a warning and the deploy goes on
    (the check reports the .pte as missing_runtime and measures the rest)."""
    from tests.fixtures.bundles import subset_bundle

    home = new_home(tmp_path).path
    inventory = tmp_path / "inv.toml"
    inventory.write_text('[devices.here]\nhost = "local"\n')
    only_pte = subset_bundle(pte_digits_bundle[0], tmp_path / "pte", PTE)
    manifest = json.loads((only_pte / "manifest.json").read_text())
    for record in manifest["artifacts"]:
        record["pte"]["executorch_version"] = "1.4.0"
    (only_pte / "manifest.json").write_text(json.dumps(manifest))
    refused = run_edgetk("deploy", only_pte, "--inventory", inventory, env=Home(home).env)
    assert refused.code == 4, refused.stdout[-2000:] + refused.stderr[-2000:]
    said = " ".join(refused.stderr.split())
    assert "model.fp32.pte was exported by executorch 1.4.0" in said and "has executorch 1.5.1" in said, said
    assert "executorch==1.4.0" in said and "devices setup" in said and "Traceback" not in said, said
    assert not list(home.glob(".edgetk/bundles/*")), "nothing is sent before the refusal"

    mixed = _edited(pte_digits_bundle[0], tmp_path / "b", "model.int8.pte", executorch_version="1.4.0")
    result = run_edgetk("deploy", mixed, "--inventory", inventory, env=Home(home).env)
    assert result.code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    said = " ".join(result.stderr.split())
    assert "warning: here: model.int8.pte was exported by executorch 1.4.0" in said, said
    assert "model.fp32.pte" not in said.split("measures", 1)[0], said  # of this release: not named as refused
    assert list(home.glob(".edgetk/bundles/*/current")), "deployed"


def test_local_deploy_check_selects_among_pte_and_onnx(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                                      executorch_native_env: DeviceEnv, tmp_path: Path) -> None:
    """``deploy --check --eval`` on `local` with the torch-free env: the .pte measured natively beside the ONNX
    artifacts, their eval set scored, and the device's selection chooses among all four."""
    bundle, _ = pte_digits_bundle
    inventory = tmp_path / "inv.toml"
    inventory.write_text(f'[devices.here]\nhost = "local"\npython = "{executorch_native_env.python}"\n')
    result = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", "--eval", *NO_GATES, "--runs", "10",
                        "--json", env=Home(new_home(tmp_path).path).env)
    assert result.code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    device = result.json()["devices"][0]
    found = {r["artifact"]: r for r in device["reports"]}
    assert set(found) == {*PTE, "model.fp32.onnx", "model.int8.onnx"}
    for name in PTE:
        assert_native(found[name], 10)
        evaluation = found[name]["evaluation"]  # check --eval: the eval set scored by the native runner
        assert evaluation["available"] is True and evaluation["samples"] == EVAL_SAMPLES, evaluation
        assert evaluation["vs_labels"]["device_accuracy"] > 0.8, evaluation
    selected = device["selected"]
    contenders = {c["artifact"]: c for c in selected["contenders"]}
    assert set(contenders) == set(found), selected  # the .pte compete with the ONNX artifacts
    for name in PTE:
        assert not contenders[name]["excluded"] and contenders[name]["p50_ms"] > 0, contenders[name]
    assert selected["artifact"] in found and selected["runtimes"]["executorch"] == "1.5.1", selected
    print("selected:", selected["artifact"], {n: c["p50_ms"] for n, c in contenders.items()})


def _edited(source: Path, tmp_path: Path, name: str, **pte: Any) -> Path:
    bundle = tmp_path / "b"
    shutil.copytree(source, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    for record in manifest["artifacts"]:
        if record["file"] == name:
            record["pte"].update(pte)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


@pytest.mark.ssh
def test_setup_builds_the_runner_on_the_device_when_this_machine_cannot(
        pte_digits_bundle: tuple[Path, dict[str, Any]], fresh_ssh_device, ssh_client_key,  # type: ignore[no-untyped-def]
        ssh_known_hosts, tmp_path: Path) -> None:
    """This machine without a compiler (its PATH holds only the toolkit's Python): setup sends the runner's source
    and the device (a loopback SSH device with g++) compiles it against the executorch wheel setup installed there;
    the .pte then run through it."""
    bundle, _ = pte_digits_bundle
    dev = fresh_ssh_device()
    inventory = tmp_path / "inv.toml"
    inventory.write_text(dev.inventory_entry(name="box", identity_file=str(ssh_client_key),
                                             known_hosts=str(ssh_known_hosts(dev)), target="generic-x86_64"))
    env = dict(Home(new_home(tmp_path).path).env, PATH=str(Path(sys.executable).parent))
    assert shutil.which("g++", path=env["PATH"]) is None and shutil.which("c++", path=env["PATH"]) is None
    result = run_edgetk("devices", "setup", "--inventory", inventory, "--offline", "--runtime", "executorch",
                        "--json", env=env, timeout=1800)
    assert result.code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    setup = result.json()["devices"][0]["setup"]
    (runner,) = [n for n in setup["notes"] if "native .pte runner" in n]
    assert "built on the device with g++" in runner, runner
    report = reports(check(next((dev.home / ".edgetk" / "venv" / "bin").glob("python")), bundle, "--runs", "3",
                           "--artifact", "model.int8.pte"))["model.int8.pte"]
    assert_native(report, 3)


def test_no_compiler_anywhere_names_what_to_install() -> None:
    """The typed refusal when neither side can build the runner: exit 2 (configuration), both ways named."""
    from toolkit.delivery.pte_runner import no_compiler_error
    from toolkit.errors import CompilerMissing

    error = no_compiler_error("pi", "aarch64")
    assert isinstance(error, CompilerMissing) and error.exit_code == 2
    assert "sudo apt-get install g++-aarch64-linux-gnu" in (error.hint or "") and "on the device" in (error.hint or "")
