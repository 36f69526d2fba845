""".pte artifacts on the emulated aarch64 Pi (tests/fixtures/arm.py, tests/fixtures/arm_executorch.py): the trained
digits CNN and the trained transformer encoder, each converted on the host to .pte fp32 and INT8, deployed and
checked there by the native runner cross-built for aarch64, in a device env with NO torch (asserted) under qemu.
Correctness only: the golden outputs (fp32 within 1e-5, INT8 within the bundle's tolerance), each artifact's
bundled self-check, the share of nodes XNNPACK took, judged by raspberry-pi-4's ``format = "pte"`` placement row,
and ``check --eval`` on the bundle's eval set; no latency is asserted.

Through the Python binding, importing torch + executorch.runtime took 43-97 s under emulation per check; the
native runner starts in well under a second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.arm.test_emulated_pi import EMULATED, _retarget
from tests.fixtures.arm import QEMU_CPU, ArmPi
from tests.fixtures.arm_executorch import ArmExecutorch
from tests.fixtures.cli import run_edgetk
from tests.fixtures.home import Home, new_home
from tests.fixtures.pte import EVAL_SAMPLES, needs_executorch, shipped_pte_floor

pytestmark = [pytest.mark.arm, needs_executorch]
PTE = ("model.fp32.pte", "model.int8.pte")


@pytest.mark.parametrize("model", ["digits", "encoder"])
def test_pte_fp32_and_int8_check_themselves_on_the_emulated_pi(
        arm_pi: ArmPi, arm_executorch: ArmExecutorch, model: str, request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    source, manifest = request.getfixturevalue(f"pte_{model}_bundle")
    bundle = _retarget(source, tmp_path / "b", name=f"{model}-pte-raspberry-pi-4", drop_formats=("onnx",))
    doc = json.loads((bundle / "manifest.json").read_text())
    floor = shipped_pte_floor()
    doc["check_policy"]["placement"] = [{"format": "pte", "on": "xnnpack", "min_nodes_pct": floor}]
    (bundle / "manifest.json").write_text(json.dumps(doc, indent=2) + "\n")
    inventory = arm_pi.inventory(tmp_path / "inv.toml", arm_pi.pi, name="pi-pte", python=arm_executorch.python)
    started = time.perf_counter()
    no_torch = subprocess.run(["chroot", str(arm_pi.device.rootfs), arm_executorch.python, "-c", "import torch"],
                              capture_output=True, text=True, check=False, env=dict(os.environ, QEMU_CPU=QEMU_CPU))
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr, no_torch.stderr[-500:]
    result = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", "--eval", *EMULATED, "--json",
                        env=Home(new_home(tmp_path).path).env, timeout=1800)
    print(f"\n[arm] executorch env: download {arm_executorch.download_s} s, install {arm_executorch.install_s} s "
          f"(None = cached), {arm_executorch.installed_mb} MB; deploy --check of the {model} net's {len(PTE)} .pte "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    assert result.code == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = {r["artifact"]: r for r in result.json()["devices"][0]["reports"]}
    print("[arm] max abs error vs the host's outputs:", {name: (r["outputs_match"] or {}).get("max_abs_error")
                                                          for name, r in found.items()}, file=sys.stderr)
    assert set(found) == set(PTE)
    shares = {a["file"]: (a["pte"]["delegated_nodes"], a["pte"]["total_nodes"]) for a in manifest["artifacts"]
              if a["format"] == "pte"}
    for name, report in found.items():
        assert report["error"] is None, report["error"]
        assert report["environment"]["arch"] == "aarch64" and report["environment"]["emulated"] is True
        assert report["runtime"]["name"] == "executorch" and report["runtime"]["version"] == "1.5.1"
        assert "XnnpackBackend" in report["runtime"]["backends"] and report["runtime"]["path"] == "native"
        assert report["runtime"]["native"]["executorch"] == "1.5.1", report["runtime"]
        match = report["outputs_match"]  # the host's golden outputs of the float model
        assert match["ok"] is True and match["top1_agreement"] >= 0.99, match
        assert match["max_abs_error"] < (1e-5 if name == "model.fp32.pte" else 1e-4), match  # its own, not the other's
        evaluation = report["evaluation"]  # check --eval: the eval set scored on the Pi
        assert evaluation["available"] is True and evaluation["samples"] == EVAL_SAMPLES, evaluation
        assert evaluation["vs_labels"]["device_accuracy"] > 0.8, evaluation
        bundled = report["bundled_check"]  # the artifact's own eval inputs and expected outputs
        assert bundled["ok"] is True and bundled["cases"] == 4 and not bundled["failed"], bundled
        assert bundled["path"] == "native", bundled
        placement = report["placement"]  # the delegation is fixed in the program: the host's count, on aarch64
        assert (placement["nodes_on_intended"], placement["nodes_total"]) == shares[name], placement
        (judged,) = report["gates"]["details"]["placement"]
        assert judged["expected"] == "xnnpack" and judged["min_nodes_pct"] == floor
        assert report["gates"]["passed"] is True, report["gates"]
