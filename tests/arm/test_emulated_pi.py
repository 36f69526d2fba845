"""End to end on an emulated aarch64 Raspberry Pi (tests/fixtures/arm.py: debootstrap arm64 rootfs, qemu-user as
a Cortex-A72, served by a chrooted sshd). Functional checks only: emulation is 10-350x slower than a real Pi,
so every check passes an explicit, generous budget and no baseline, and no latency figure is asserted.

Two device users in the same rootfs: ``pi`` gets the modern environment (numpy 2 + onnxruntime + ai-edge-litert,
aarch64 wheels downloaded on the host and pushed: the device has no internet), ``legacy`` the legacy-Pi one
(numpy 1.26 + tflite-runtime 2.14, only published as manylinux_2_34_aarch64)."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.arm import ArmPi
from tests.fixtures.bundles import subset_bundle
from tests.fixtures.cli import CliResult, assert_clean_error, run_edgetk

pytestmark = pytest.mark.arm

EMULATED = ("--budget-ms", "600000", "--baseline", "none", "--runs", "3", "--warmup", "1")


def _retarget(source: Path, out: Path, *, name: str, drop_formats: tuple[str, ...] = ()) -> Path:
    """A copy of a test bundle whose manifest says it was built for raspberry-pi-4 (aarch64)."""
    shutil.copytree(source, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["name"] = name
    manifest["target"] = {"name": "raspberry-pi-4", "arch": "aarch64"}
    policy = manifest.get("check_policy") or {"latency_budget_ms": None}  # the manifest's key, null: no budget
    policy["placement"] = [{"format": "tflite", "on": "xnnpack", "min_nodes_pct": 40}]  # raspberry-pi-4's
    manifest["check_policy"] = policy
    kept = []
    for artifact in manifest["artifacts"]:
        if artifact["format"] in drop_formats:
            (out / artifact["file"]).unlink()
            golden = (artifact.get("golden") or {}).get("outputs")
            if golden and (out / golden).exists():
                (out / golden).unlink()
        else:
            kept.append(artifact)
    manifest["artifacts"] = kept
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("arm-home")
    return {"HOME": str(home), "EDGETK_STORE": str(home / "history.sqlite"),
            "XDG_CACHE_HOME": str(home / "cache")}


@pytest.fixture(scope="module")
def pi_inventory(arm_pi: ArmPi, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return arm_pi.inventory(tmp_path_factory.mktemp("inv") / "pi.toml", arm_pi.pi, name="pi")


@pytest.fixture(scope="module")
def legacy_inventory(arm_pi: ArmPi, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return arm_pi.inventory(tmp_path_factory.mktemp("inv") / "legacy.toml", arm_pi.legacy, name="legacy-pi",
                            target="raspberry-pi-4")


def _timed(*args: Any, env: dict[str, str]) -> tuple[CliResult, float]:
    started = time.perf_counter()
    result = run_edgetk(*args, env=env, timeout=1800)
    return result, time.perf_counter() - started


@pytest.fixture(scope="module")
def pi_setup(arm_pi: ArmPi, pi_inventory: Path, env: dict[str, str]) -> dict[str, Any]:
    result, seconds = _timed("devices", "setup", "--inventory", pi_inventory, "--offline", "--json", env=env)
    assert result.code == 0, result.stderr
    doc: dict[str, Any] = result.json()["devices"][0]["setup"]
    print(f"\n[arm] rootfs build {arm_pi.image.build_s or 0:.0f} s (0 = cached), device start "
          f"{arm_pi.setup_s:.1f} s, setup --offline {seconds:.0f} s", file=sys.stderr)
    return doc


def test_probe_sees_an_emulated_aarch64_and_suggests_generic(arm_pi: ArmPi, pi_inventory: Path,
                                                           env: dict[str, str]) -> None:
    result = run_edgetk("devices", "probe", "--inventory", pi_inventory, "--json", env=env)
    assert result.code == 0, result.stderr
    probe = result.json()["devices"][0]["probe"]
    environment = probe["environment"]
    assert environment["arch"] == "aarch64"
    assert environment["emulated"] is True  # an aarch64 kernel reporting the host's x86 CPU
    assert probe["profile"] == "generic-aarch64"
    assert environment["python"].startswith("3.11") and environment["glibc"] == "2.36"
    text = run_edgetk("devices", "probe", "--inventory", pi_inventory, env=env)
    assert "aarch64" in text.stdout and "profile: generic-aarch64" in text.stdout


def test_offline_setup_installs_aarch64_wheels(arm_pi: ArmPi, pi_setup: dict[str, Any]) -> None:
    assert pi_setup["mode"] == "offline"
    assert pi_setup["platform"] == "linux aarch64, glibc 2.36, CPython 3.11 (cp311)"
    assert pi_setup["profile"] == "generic-aarch64"
    installed = pi_setup["installed"]
    assert set(installed) == {"numpy", "litert", "onnxruntime"} and all(installed.values())
    assert int(installed["onnxruntime"].split(".")[1]) >= 16  # the profile's bound
    home = arm_pi.home(arm_pi.pi)
    assert pi_setup["python"] == f"/home/{arm_pi.pi}/.edgetk/venv/bin/python"
    assert json.loads((home / ".edgetk" / "config.json").read_text())["python"] == pi_setup["python"]
    wheels = sorted(p.name for p in (home / ".edgetk" / "wheels").glob("*/*.whl"))
    for dist in ("numpy-", "onnxruntime-", "ai_edge_litert-"):
        (wheel,) = [w for w in wheels if w.startswith(dist)]
        assert "aarch64" in wheel, wheel
    site = home / ".edgetk" / "venv" / "lib" / "python3.11" / "site-packages"
    libs = list((site / "onnxruntime" / "capi").glob("onnxruntime_pybind11_state*.so"))
    assert libs and libs[0].read_bytes()[18] == 0xB7  # ELF e_machine = EM_AARCH64


def test_deploy_check_of_a_raspberry_pi_4_bundle(arm_pi: ArmPi, pi_setup: dict[str, Any], pi_inventory: Path,
                                                 tiny_bundle: Path, env: dict[str, str], tmp_path: Path) -> None:
    bundle = _retarget(tiny_bundle, tmp_path / "b", name="digits-raspberry-pi-4")
    result = run_edgetk("deploy", bundle, "--inventory", pi_inventory, "--check", *EMULATED, "--profile", "--json",
                        env=env, timeout=1800)
    assert result.code == 0, result.stdout + result.stderr
    (entry,) = result.json()["devices"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert sorted(r["artifact"] for r in entry["reports"]) == sorted(a["file"] for a in manifest["artifacts"])
    runtimes = set()
    for report in entry["reports"]:
        assert report["error"] is None, report
        assert report["environment"]["arch"] == "aarch64"
        assert report["outputs_match"]["ok"] is True, report["outputs_match"]
        assert report["outputs_match"]["top1_agreement"] >= 0.99
        assert report["runs"] == 3 and report["gates"]["passed"] is True
        runtimes.add(report["runtime"]["name"])
        # --profile on aarch64: ORT's profiler times each node; LiteRT says it cannot and counts the nodes. Under
        # this emulation XNNPACK was seen to take none of the TFLite nodes (all on the CPU kernels): the report
        # must then name them as fallen back, which is what a real device with that problem would need.
        placement, profile = report["placement"], report["profile"]
        assert placement["nodes_total"] > 0 and 0 <= placement["nodes_on_intended"] <= placement["nodes_total"]
        assert placement["fell_back"] is (placement["nodes_on_intended"] < placement["nodes_total"])
        assert bool(placement["fallback_ops"]) is placement["fell_back"], placement
        if report["artifact"].endswith(".tflite"):  # the Pi profile's XNNPACK >= 40%: reported, not judged here
            assert report["environment"]["emulated"] is True
            assert any("not judged on an emulated device" in s for s in report["gates"]["skipped"]), report["gates"]
        assert profile["by_op_type"] and profile["available"] is (report["runtime"]["name"] == "onnxruntime")
    assert runtimes == {"litert", "onnxruntime"}


def test_a_bundle_for_x86_64_is_refused(arm_pi: ArmPi, pi_inventory: Path, env: dict[str, str],
                                        deploy_bundle_factory: Any) -> None:
    bundle = deploy_bundle_factory(name="pc-only", target="generic-x86_64", target_arch="x86_64")
    result = run_edgetk("deploy", bundle, "--inventory", pi_inventory, env=env)
    assert_clean_error(result, 2, "built for x86_64", "aarch64")
    assert not (arm_pi.home(arm_pi.pi) / ".edgetk" / "bundles" / "pc-only").exists()


def test_legacy_pi_with_tflite_runtime(arm_pi: ArmPi, legacy_inventory: Path, tiny_bundle: Path,
                                       env: dict[str, str], tmp_path: Path) -> None:
    result = run_edgetk("devices", "setup", "--inventory", legacy_inventory, "--offline", "--runtime",
                        "tflite-runtime", "--json", env=env, timeout=1800)
    assert result.code == 0, result.stderr
    setup = result.json()["devices"][0]["setup"]
    assert setup["profile"] == "raspberry-pi-4"  # the inventory's target sets the version bounds
    assert setup["installed"]["tflite-runtime"].startswith("2.14")
    assert setup["installed"]["numpy"].startswith("1.26")
    wheels = [p.name for p in (arm_pi.home(arm_pi.legacy) / ".edgetk" / "wheels").glob("*/tflite_runtime-*.whl")]
    assert wheels and "manylinux_2_34_aarch64" in wheels[0]

    bundle = _retarget(tiny_bundle, tmp_path / "legacy", name="digits-legacy-pi", drop_formats=("onnx",))
    checked = run_edgetk("deploy", bundle, "--inventory", legacy_inventory, "--check", *EMULATED, "--json",
                         env=env, timeout=1800)
    assert checked.code == 0, checked.stdout + checked.stderr
    reports = checked.json()["devices"][0]["reports"]
    assert len(reports) == 2
    for report in reports:
        assert report["error"] is None, report
        assert report["runtime"]["name"] == "tflite-runtime"
        assert report["runtime"]["version"] == setup["installed"]["tflite-runtime"]
        assert report["environment"]["arch"] == "aarch64"
        assert report["outputs_match"]["ok"] is True


def test_the_emulated_pi_selects_by_its_own_measurements(arm_pi: ArmPi, pi_setup: dict[str, Any],
                                                         pi_inventory: Path, env: dict[str, str],
                                                         tmp_path: Path) -> None:
    """The device chooses (toolkit/checks/selection.py): the bundle proposes its slow TFLite; the Pi's check measures
    both artifacts and selects the fastest by its own p50s. Emulated latencies: this shows only that the decision
    follows the device's numbers (tests/selection/test_device_selection.py does the same on x86 devices)."""
    from tests.fixtures.selection import selection_bundle

    bundle = selection_bundle(tmp_path / "choose", name="choose-pi")
    result = run_edgetk("deploy", bundle, "--inventory", pi_inventory, "--check", "--budget-ms", "600000",
                        "--baseline", "none", "--runs", "6", "--warmup", "1", "--json", env=env, timeout=1800)
    assert result.code == 0, result.stdout + result.stderr
    selected = result.json()["devices"][0]["selected"]
    p50 = {c["artifact"]: c["p50_ms"] for c in selected["contenders"]}
    print(f"\n[arm] selection p50s {p50}: selected {selected['artifact']}", file=sys.stderr)
    assert selected["proposed"] == "model.fp32.tflite"
    assert selected["artifact"] == min(p50, key=p50.__getitem__) == "model.fp32.onnx", selected
    on_device = arm_pi.home(arm_pi.pi) / ".edgetk" / "bundles" / "choose-pi" / "selected.json"
    assert json.loads(on_device.read_text())["artifact"] == "model.fp32.onnx"


def test_check_eval_on_the_pi_reports_what_local_reports(arm_pi: ArmPi, pi_setup: dict[str, Any],
                                                         pi_inventory: Path, eval_bundle: Path,
                                                         env: dict[str, str], tmp_path: Path) -> None:
    """``check --eval`` of one INT8 TFLite artifact on the emulated Pi: the eval set (497 held-out digits,
    pushed and verified by sha256 on the device) scores the same accuracy there as on the local device."""
    one = subset_bundle(eval_bundle, tmp_path / "one", ("model.int8.tflite",))
    here = run_edgetk("deploy", one, "--device", "local", "--check", "--eval", *EMULATED, "--json", env=env)
    bundle = _retarget(one, tmp_path / "pi", name="digits-eval-raspberry-pi-4")
    there = run_edgetk("deploy", bundle, "--inventory", pi_inventory, "--check", "--eval", *EMULATED, "--json",
                       env=env, timeout=1800)
    assert here.code == 0, here.stdout + here.stderr
    assert there.code == 0, there.stdout + there.stderr
    (local,) = here.json()["devices"][0]["reports"]
    (pi,) = there.json()["devices"][0]["reports"]
    assert pi["environment"]["arch"] == "aarch64" and local["environment"]["arch"] == "x86_64"
    on_pi, on_local = pi["evaluation"], local["evaluation"]
    assert on_pi["available"] and on_local["available"], (on_pi, on_local)
    assert on_pi["samples"] == on_local["samples"] == 497
    assert on_pi["vs_labels"]["device_accuracy"] > 0.9  # a trained model, run by the Pi's own aarch64 kernels
    assert on_pi["vs_labels"] == on_local["vs_labels"], (on_pi, on_local)
    assert on_pi["vs_float"]["top1_agreement"] == on_local["vs_float"]["top1_agreement"]
    print(f"\n[arm] check --eval model.int8.tflite: Pi {on_pi['vs_labels']}, max abs error vs float "
          f"{on_pi['vs_float']['max_abs_error']} (local {on_local['vs_float']['max_abs_error']}), "
          f"{on_pi['seconds']} s on the Pi for {on_pi['chunks']} chunks", file=sys.stderr)
