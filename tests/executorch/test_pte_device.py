"""The .pte artifacts on a device: the runner (a device env's python, no toolkit) loads them through ExecuTorch's
Python binding (torch; the path where no native runner is installed, tests/executorch/test_pte_native.py has the
native one), measures them like the other formats and checks their numbers twice: against the bundle's
golden outputs and with their own bundled program. A device without ExecuTorch reports ``missing_runtime`` for
the .pte while its ONNX artifacts are measured. Then ``devices setup --offline --runtime executorch`` on a
loopback SSH device (no torch: the native runner) and ``deploy --check`` there with the venv it made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.pte import needs_executorch, shipped_pte_floor
from tests.fixtures.cli import run_edgetk
from tests.fixtures.device_envs import DeviceEnv
from tests.runner.test_runner import check, reports, run_runner
from tests.fixtures.home import Home, new_home

pytestmark = needs_executorch
NO_GATES = ("--budget-ms", "100000", "--baseline", "none")
PTE = ("model.fp32.pte", "model.int8.pte")


def assert_pte_measured(report: dict[str, Any], runs: int) -> None:
    assert report["error"] is None, report["error"]
    assert report["runtime"]["name"] == "executorch" and report["runtime"]["version"] == "1.5.1"
    assert "XnnpackBackend" in report["runtime"]["backends"]
    assert report["runs"] == runs and report["load_ms"] > 0 and report["first_inference_ms"] > 0
    latency = report["latency_ms"]
    assert 0 < latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert 10 < report["peak_rss_mb"] < 4000
    match = report["outputs_match"]
    assert match["ok"] is True and match["top1_agreement"] == 1.0, match
    # its own host outputs, same runtime build: far closer than its INT8 atol, which would also pass the OTHER
    # artifact's outputs (0.17 between this net's fp32 and INT8): a runner that ran the wrong .pte fails here
    assert match["max_abs_error"] < 1e-4, match
    bundled = report["bundled_check"]  # the device's own numbers, from the artifact's bundled program
    assert bundled["ok"] is True and bundled["cases"] == 4 and not bundled["failed"], bundled
    placement = report["placement"]
    assert placement["intended"] == "XNNPACK" and placement["nodes_total"] >= placement["nodes_on_intended"] > 0


def test_runner_measures_pte_and_checks_itself(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                               executorch_env: DeviceEnv) -> None:
    bundle, _ = pte_digits_bundle
    doc = check(executorch_env, bundle, "--runs", "20", *(a for name in PTE for a in ("--artifact", name)),
                "--profile")
    found = reports(doc)
    for name in PTE:
        assert_pte_measured(found[name], 20)
        profile = found[name]["profile"]
        assert profile["available"] is True and profile["source"] == "etdump", profile
        assert any(op["name"] == "DELEGATE_CALL" for op in profile["top"]), profile
        print(name, found[name]["latency_ms"]["p50"], "ms p50;", [op["name"] for op in profile["top"][:4]])
    probe = run_runner(executorch_env.python, "probe")
    assert probe["runtimes"]["executorch"] == "1.5.1" and probe["runtimes"]["litert"] is None


def test_local_device_check(pte_digits_bundle: tuple[Path, dict[str, Any]], executorch_env: DeviceEnv,
                            tmp_path: Path) -> None:
    """``edgetk check --device``-style over the `local` connection (the host itself, the env's python)."""
    bundle, _ = pte_digits_bundle
    home = new_home(tmp_path).path
    inventory = tmp_path / "inv.toml"
    inventory.write_text(f'[devices.here]\nhost = "local"\npython = "{executorch_env.python}"\n')
    env = Home(home).env
    result = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, "--runs", "10", "--json",
                        env=env)
    assert result.code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    found = {r["artifact"]: r for r in result.json()["devices"][0]["reports"]}
    for name in PTE:
        assert found[name]["error"] is None and found[name]["outputs_match"]["ok"] is True, found[name]
        assert found[name]["outputs_match"]["max_abs_error"] < 1e-4, found[name]  # as in assert_pte_measured
        bundled = found[name]["bundled_check"]  # the device's self-check reaches the host's report
        assert bundled["ok"] is True and bundled["cases"] == 4 and bundled["file"] == name[:-4] + ".bpte", bundled
    assert found["model.fp32.onnx"]["bundled_check"] is None
    for name, report in found.items():  # the .pte shared one import, each measured in its own forked process
        worker = report["worker"]
        if name in PTE:
            assert worker["process"] == "forked" and sorted(worker["artifacts"]) == sorted(PTE), worker
            assert worker["import_ms"] > 0 and worker["import_peak_rss_mb"] > 0, worker
        else:
            assert worker is None, worker


def test_a_wrong_expectation_fails_the_bundled_check(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                                     executorch_env: DeviceEnv, tmp_path: Path) -> None:
    """Not vacuous: the same bundled program at a limit below the artifact's own INT8 error fails."""
    import shutil

    from toolkit.delivery.bundle import sha256_file

    source, _ = pte_digits_bundle
    bundle = tmp_path / "b"
    shutil.copytree(source, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    for record in manifest["artifacts"]:
        if record["file"] == "model.int8.pte":
            record["pte"]["bundled_atol"] = 1e-7
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert sha256_file(bundle / "model.int8.pte") == next(
        a["sha256"] for a in manifest["artifacts"] if a["file"] == "model.int8.pte")
    report = reports(check(executorch_env, bundle, "--runs", "3", "--artifact", "model.int8.pte"))["model.int8.pte"]
    assert report["bundled_check"]["ok"] is False and report["bundled_check"]["failed"]
    assert report["outputs_match"]["ok"] is False


def test_placement_row_gates_the_delegated_share(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                                 executorch_env: DeviceEnv, tmp_path: Path) -> None:
    """A profile's ``format = "pte"`` placement row, gated on the share the device's runner reports: at the larger
    of the two artifacts' shares (fp32 9 of 10 nodes, int8 27 of 28), the artifact below it fails the check naming
    its count, the other passes, and the ONNX artifacts beside them are not held to a .pte row."""
    import shutil

    from tests.test_gates_device import with_policy
    from toolkit.model.policy import CheckPolicy, PlacementExpectation
    from toolkit.model.vocabulary import Format

    source, manifest = pte_digits_bundle
    counts = {a["file"]: (a["pte"]["delegated_nodes"], a["pte"]["total_nodes"]) for a in manifest["artifacts"]
              if a["format"] == "pte"}
    floor = max(100.0 * on / total for on, total in counts.values())
    below = {name for name, (on, total) in counts.items() if 100.0 * on / total < floor}
    assert below and below != set(counts), counts  # one artifact on each side of the row's min: not vacuous
    assert all(100.0 * on / total >= shipped_pte_floor() for on, total in counts.values())  # the shipped row
    bundle = tmp_path / "b"
    shutil.copytree(source, bundle)
    with_policy(bundle, CheckPolicy(target="pte-board", latency_budget_ms=None, placement=(
        PlacementExpectation(format=Format.PTE, on="xnnpack", min_nodes_pct=floor),)))
    inventory = tmp_path / "inv.toml"
    inventory.write_text(f'[devices.here]\nhost = "local"\npython = "{executorch_env.python}"\n')
    result = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, "--runs", "5", "--json",
                        env=Home(new_home(tmp_path).path).env)
    assert result.code == 1, result.stdout[-2000:] + result.stderr[-2000:]
    found = {r["artifact"]: r for r in result.json()["devices"][0]["reports"]}
    for name, report in found.items():
        assert report["error"] is None and report["outputs_match"]["ok"] is True, report
        gates = report["gates"]
        if name in below:
            on, total = counts[name]
            assert report["placement"]["nodes_on_intended"] == on and report["placement"]["nodes_total"] == total
            assert gates["reasons"] == [f"{name}: {on} of {total} nodes ({100.0 * on / total:.0f}%) ran on xnnpack; "
                                        f"the target expects at least {floor:g}%"], gates
            print(gates["reasons"][0])
        else:
            assert gates["passed"] is True, gates
        if name.endswith(".pte"):
            (judged,) = gates["details"]["placement"]
            assert judged["expected"] == "xnnpack" and judged["min_nodes_pct"] == floor
        else:
            assert "placement" not in gates["details"], gates


def test_device_without_executorch_measures_the_rest(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                                     device_env: DeviceEnv) -> None:
    bundle, manifest = pte_digits_bundle
    found = reports(check(device_env, bundle, "--runs", "5"))
    assert set(found) == {a["file"] for a in manifest["artifacts"]}
    for name in PTE:
        error = found[name]["error"]
        assert error["kind"] == "missing_runtime" and "--runtime executorch" in error["hint"], error
    for name in ("model.fp32.onnx", "model.int8.onnx"):
        assert found[name]["error"] is None and found[name]["outputs_match"]["ok"] is True


@pytest.mark.ssh
def test_offline_setup_with_executorch_then_deploy_check(pte_digits_bundle: tuple[Path, dict[str, Any]],
                                                          fresh_ssh_device, ssh_client_key, ssh_known_hosts,  # type: ignore[no-untyped-def]
                                                          tmp_path: Path) -> None:
    """``devices setup --offline --runtime executorch`` on a loopback device: executorch 1.5.1 (the exporter's
    release) without its exporter-side dependencies and without torch, plus the native .pte runner built on this
    machine and put beside its libraries; then the .pte artifacts run natively with the venv setup recorded, over
    SSH, beside the ONNX artifacts."""
    from tests.executorch.test_pte_native import assert_native, assert_no_torch

    bundle, _ = pte_digits_bundle
    dev = fresh_ssh_device()
    inventory = tmp_path / "inv.toml"
    inventory.write_text(dev.inventory_entry(name="box", identity_file=str(ssh_client_key),
                                             known_hosts=str(ssh_known_hosts(dev)), target="generic-x86_64"))
    env = Home(new_home(tmp_path).path).env
    result = run_edgetk("devices", "setup", "--inventory", inventory, "--offline", "--runtime", "executorch",
                        "--runtime", "onnxruntime", "--json", env=env, timeout=1800)
    assert result.code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    setup = result.json()["devices"][0]["setup"]
    installed = setup["installed"]
    assert installed["executorch"] == "1.5.1" and installed["onnxruntime"] and "torch" not in installed, installed
    print(f"setup --offline executorch: {setup['wheels_sent']} wheels, {setup['bytes_sent'] / 1e6:.0f} MB, "
          f"{setup['seconds']:.0f} s")
    assert not any("lists executorch" in note for note in setup["notes"]), setup["notes"]
    (runner,) = [n for n in setup["notes"] if "native .pte runner" in n]
    assert "on this machine" in runner and runner.endswith("/executorch/lib/edgetk-pte-runner"), runner
    site = next((dev.home / ".edgetk" / "venv" / "lib").glob("python3.*")) / "site-packages"
    assert not list(site.glob("hydra*")) and not list(site.glob("coremltools*"))  # --no-deps: no exporter tooling
    assert (site / "executorch" / "lib" / "edgetk-pte-runner").is_file()
    assert_no_torch(dev.home / ".edgetk" / "venv" / "bin" / "python")
    checked = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, "--runs", "5", "--json",
                         env=env, timeout=1800)
    assert checked.code == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    found = {r["artifact"]: r for r in checked.json()["devices"][0]["reports"]}
    assert set(found) == {*PTE, "model.fp32.onnx", "model.int8.onnx"}  # measured side by side
    for name, report in found.items():
        if name.endswith(".pte"):
            assert_native(report, 5)
        else:
            assert report["error"] is None and report["outputs_match"]["ok"] is True, report
            assert report["runtime"]["name"] == "onnxruntime" and report["bundled_check"] is None
