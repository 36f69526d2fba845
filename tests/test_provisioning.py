"""``edgetk devices setup``: the platform/tag logic, the real ``pip download`` for a platform without wheels, and
offline setup of a real loopback sshd device (x86_64, wheels downloaded on the host for the device's platform,
pushed over SFTP, installed with --no-index), after which deploy/check/probe use the recorded venv."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.cli import assert_clean_error, run_edgetk, run_edgetk_inproc
from tests.fixtures.deploy_helpers import write_inventory
from toolkit.errors import UsageError
from toolkit.delivery.provisioning import (
    DevicePlatform,
    default_runtimes,
    import_failure_hint,
    left_out,
    plan_requirements,
    platform_from_probe,
    specifier_for,
)
from toolkit.delivery.wheels import Requirement, download_wheels
from toolkit.model.targets import get_profile

NO_GATES = ("--budget-ms", "100000", "--baseline", "none")


# ------------------------------------------------------------------------------------------- unit


def test_platform_tags_cover_every_glibc_the_device_allows() -> None:
    pi = DevicePlatform("aarch64", (3, 11), (2, 36))
    tags = pi.platform_tags()
    assert tags[0] == "manylinux_2_36_aarch64"
    assert "manylinux_2_34_aarch64" in tags  # tflite-runtime 2.14's only aarch64 tag
    assert tags[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert not any("manylinux1" in t or "manylinux2010" in t for t in tags)
    old_x86 = DevicePlatform("x86_64", (3, 6), (2, 27)).platform_tags()
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"} <= set(old_x86)
    assert DevicePlatform("armv6l", (3, 11), (2, 36)).platform_tags() == []
    assert DevicePlatform("aarch64", (3, 11), None).platform_tags() == []
    assert pi.key == "linux_aarch64-glibc2.36-cp311"


def test_platform_from_probe_reads_the_interpreter_not_the_kernel() -> None:
    # 32-bit Raspberry Pi OS on a 64-bit kernel: uname says aarch64, the interpreter is armv7l
    doc = {"arch": "aarch64", "pointer_bits": 32, "python": "3.11.2", "glibc": "2.36", "abi": "cp311"}
    assert platform_from_probe(doc) == DevicePlatform("armv7l", (3, 11), (2, 36), "cp", "cp311")
    jetson = platform_from_probe({"arch": "aarch64", "pointer_bits": 64, "python": "3.6.9", "glibc": "2.27",
                                  "abi": "cp36m"})
    assert jetson.abi_tag == "cp36m" and jetson.python_version == "3.6"


def test_requirements_follow_the_profile_bounds() -> None:
    assert specifier_for("2.14", "2.14") == ">=2.14,<2.15"
    assert specifier_for("1.16", None) == ">=1.16"
    pi4 = get_profile("raspberry-pi-4")
    assert default_runtimes(pi4) == ("litert", "onnxruntime")  # one TFLite runtime, not both; executorch on request
    assert "installed only with --runtime executorch" in left_out(pi4, default_runtimes(pi4))[0]
    assert left_out(pi4, ("executorch",)) == [] and left_out(get_profile("jetson-nano"), ("onnxruntime",)) == []
    reqs, notes = plan_requirements(("tflite-runtime",), pi4)
    assert reqs == [Requirement("numpy", "numpy", "<2"), Requirement("tflite-runtime", "tflite-runtime", ">=2.14,<2.15")]
    assert notes == []
    _, notes = plan_requirements(("tflite-runtime",), get_profile("generic-aarch64"))
    assert "does not list tflite-runtime" in notes[0]
    with pytest.raises(UsageError):
        plan_requirements(("tensorrt",), pi4)


def test_executorch_is_the_exporters_release_without_torch() -> None:
    """executorch runs on the device through the native runner, so setup installs it --no-deps and nothing it does
    not declare (no torch, no flatbuffers: the runner reads the bundled program itself), pinned to this machine's
    release, the one that exports the .pte (no other is guaranteed to load them)."""
    from toolkit.delivery.pte_runner import exporter_version

    pi5 = get_profile("raspberry-pi-5")
    reqs, notes = plan_requirements(("executorch",), pi5)
    by_name = {r.name: r for r in reqs}
    assert set(by_name) == {"numpy", "executorch"} and by_name["executorch"].without_deps, reqs
    assert exporter_version() == "1.5.1" and by_name["executorch"].pip == "executorch==1.5.1"
    assert notes == []
    (note,) = left_out(pi5, default_runtimes(pi5))
    assert "native .pte runner" in note and "missing_runtime" in note and "PIP_EXTRA_INDEX_URL" not in note


def test_a_runtime_that_does_not_import_names_what_is_missing() -> None:
    """The verify step's hint follows the import error (the texts as measured: executorch without torch, PyPI's
    aarch64 torch 2.13.0 without its CUDA libraries), not always "a newer CPU or OS"."""
    assert "'torch'" in import_failure_hint("No module named 'torch'")
    cuda = "libcudart.so.13: cannot open shared object file: No such file or directory"
    assert "libcudart.so.13" in import_failure_hint(cuda)
    assert "newer CPU or OS" in import_failure_hint("Illegal instruction")
    assert "newer CPU or OS" not in import_failure_hint(cuda)


def test_the_runner_and_setup_read_one_runtime_table() -> None:
    """The rows are written once (toolkit/device_side/shared.py); the shipped runner, which imports nothing from
    toolkit, carries them inlined and derives its tables from them: the assembled file agrees with the host's."""
    import importlib.util

    from toolkit import device_side
    from toolkit.model.vocabulary import Format, Runtime
    from toolkit.runtimes.spec import RUNTIME_SPECS, runtimes_for

    path = device_side.source_path(device_side.RUNNER_FILE)
    spec = importlib.util.spec_from_file_location("edgetk_runner_table", path)
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    assert {row.runtime for row in RUNTIME_SPECS} == set(Runtime)
    assert list(runner.PACKAGES) == [*(row.runtime for row in RUNTIME_SPECS), "numpy"]  # the probe asks for each
    for row in RUNTIME_SPECS:
        assert runner.PACKAGES[row.runtime] == (row.module, row.distributions)
        assert runner.INSTALL_HINTS[row.runtime] == row.install_hint
    for fmt, names in ((Format.TFLITE, runner.TFLITE_RUNTIMES), (Format.ONNX, runner.ONNX_RUNTIMES),
                       (Format.PTE, runner.PTE_RUNTIMES)):
        assert runtimes_for(fmt) == names


def test_no_wheel_for_an_old_armv7_device_names_platform_and_alternatives(tmp_path: Path) -> None:
    """A fake probe result (armv7l, CPython 3.6, glibc 2.28): the real pip download runs against the index."""
    device = platform_from_probe({"arch": "armv7l", "pointer_bits": 32, "python": "3.6.15", "glibc": "2.28",
                                  "abi": "cp36m"})
    reqs, _ = plan_requirements(("litert",), None)
    with pytest.raises(UsageError) as caught:
        download_wheels(device, reqs, cache_root=tmp_path)
    error = caught.value
    assert error.exit_code == 2
    assert "ai-edge-litert" in error.message
    assert "linux armv7l, glibc 2.28, CPython 3.6 (cp36m)" in error.message
    assert "manylinux_2_28_armv7l" in error.message and "manylinux2014_armv7l" in error.message
    assert error.hint and ("--runtime" in error.hint or "newer OS" in error.hint)


# ------------------------------------------------------------------------------------------- a real device


@pytest.mark.ssh
def test_offline_setup_of_a_loopback_device_is_used_by_deploy_and_probe(
        fresh_ssh_device, ssh_client_key, ssh_known_hosts, tiny_deploy_bundle, device_env, tmp_path):
    dev = fresh_ssh_device()
    inventory = tmp_path / "inv.toml"
    inventory.write_text(dev.inventory_entry(name="box", identity_file=str(ssh_client_key),
                                             known_hosts=str(ssh_known_hosts(dev)), target="generic-x86_64"))
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "EDGETK_STORE": str(tmp_path / "history.sqlite")}
    (tmp_path / "home").mkdir()

    result = run_edgetk("devices", "setup", "--inventory", inventory, "--offline", "--runtime", "onnxruntime",
                        "--json", env=env)
    assert result.code == 0, result.stderr
    (entry,) = result.json()["devices"]
    setup = entry["setup"]
    assert setup["mode"] == "offline" and setup["venv_reused"] is False
    assert setup["platform"].startswith("linux x86_64, glibc 2.")
    assert setup["profile"] == "generic-x86_64"
    assert setup["installed"]["onnxruntime"] and int(setup["installed"]["onnxruntime"].split(".")[1]) >= 17
    assert setup["installed"]["numpy"]
    assert setup["wheels_sent"] >= 3 and setup["bytes_sent"] > 5e6  # pip + numpy + onnxruntime (+ deps)
    venv_python = dev.home / ".edgetk" / "venv" / "bin" / "python"
    assert setup["python"] == str(venv_python)
    config = json.loads((dev.home / ".edgetk" / "config.json").read_text())
    assert config["python"] == str(venv_python)
    cached = list((tmp_path / "cache" / "edgetk" / "wheels").glob("linux_x86_64-glibc2.*-cp3*/onnxruntime-*.whl"))
    assert cached, "the wheels are cached on the host per platform"

    # later commands use the recorded venv: the probe sees onnxruntime, deploy --check runs the ONNX bundle
    probe = run_edgetk("devices", "probe", "--inventory", inventory, "--json", env=env)
    assert probe.code == 0, probe.stderr
    runtimes = probe.json()["devices"][0]["probe"]["runtimes"]
    assert runtimes["onnxruntime"] == setup["installed"]["onnxruntime"] and runtimes["litert"] is None
    deployed = run_edgetk("deploy", tiny_deploy_bundle, "--inventory", inventory, "--check", *NO_GATES,
                          "--runs", "3", "--json", env=env)
    assert deployed.code == 0, deployed.stderr
    (report,) = deployed.json()["devices"][0]["reports"]
    assert report["error"] is None and report["outputs_match"]["ok"] is True
    assert report["runtime"]["name"] == "onnxruntime"

    # a second run reuses the venv and sends nothing
    again = run_edgetk("devices", "setup", "--inventory", inventory, "--offline", "--runtime", "onnxruntime",
                       "--json", env=env)
    assert again.code == 0, again.stderr
    second = again.json()["devices"][0]["setup"]
    assert second["venv_reused"] is True and second["wheels_sent"] == 0

    # an inventory `python` wins over the recorded venv
    pinned = tmp_path / "pinned.toml"
    write_inventory(pinned, [dev], python=str(device_env.python), key=ssh_client_key,
                    known_hosts=ssh_known_hosts(dev), names=["box"])
    probe = run_edgetk("devices", "probe", "--inventory", pinned, "--json", env=env)
    assert probe.json()["devices"][0]["probe"]["runtimes"]["litert"] == "2.3.0"


@pytest.mark.ssh
def test_setup_refuses_a_directory_that_is_not_a_venv(fresh_ssh_device, ssh_client_key, ssh_known_hosts,
                                                      tmp_path):
    dev = fresh_ssh_device()
    target = dev.home / "stuff"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    inventory = tmp_path / "inv.toml"
    inventory.write_text(dev.inventory_entry(name="box", identity_file=str(ssh_client_key),
                                             known_hosts=str(ssh_known_hosts(dev))))
    result = run_edgetk("devices", "setup", "--inventory", inventory, "--venv", "~/stuff",
                        env={"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert_clean_error(result, 2, "not a virtual environment", "--venv")
    assert (target / "keep.txt").read_text() == "mine"


def test_setup_usage_errors() -> None:
    assert_clean_error(run_edgetk_inproc("devices", "setup"), 2, "No device given")
    assert_clean_error(run_edgetk_inproc("devices", "setup", "--device", "local", "--target", "raspberry-pie-4"),
                       2, "raspberry-pie-4")
    assert_clean_error(run_edgetk_inproc("devices", "setup", "--device", "local", "--venv", "~"), 2, "--venv")


@pytest.mark.ssh
def test_online_setup_runs_pip_on_the_device(fresh_ssh_device, ssh_client_key, ssh_known_hosts, tmp_path):
    """Online mode: the venv is made with ensurepip and pip runs ON the device (this loopback one reaches PyPI);
    the profile's bound (raspberry-pi-4: tflite-runtime 2.14.x, hence numpy < 2) is what pip is asked for."""
    dev = fresh_ssh_device()
    inventory = tmp_path / "inv.toml"
    inventory.write_text(dev.inventory_entry(name="box", identity_file=str(ssh_client_key),
                                             known_hosts=str(ssh_known_hosts(dev))))
    result = run_edgetk("devices", "setup", "--inventory", inventory, "--runtime", "tflite-runtime", "--target",
                        "raspberry-pi-4", "--venv", "~/envs/legacy", "--json",
                        env={"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert result.code == 0, result.stderr
    setup = result.json()["devices"][0]["setup"]
    assert setup["mode"] == "online" and setup["wheels_sent"] == 0
    assert setup["installed"]["tflite-runtime"].startswith("2.14.") and setup["installed"]["numpy"].startswith("1.")
    assert setup["python"] == str(dev.home / "envs" / "legacy" / "bin" / "python")
    assert (dev.home / "envs" / "legacy" / "bin" / "pip").exists()  # ensurepip, not a pushed wheel
    assert not (tmp_path / "cache" / "edgetk").exists()  # nothing was downloaded on the host
    assert json.loads((dev.home / ".edgetk" / "config.json").read_text())["python"] == setup["python"]
