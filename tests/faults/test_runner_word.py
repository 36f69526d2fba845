"""The device's word, made trustworthy: a device Python that lies, dies or runs out of memory while the runner
checks (tests/fixtures/lying_python.py: a wrapper the inventory's ``python`` names) gets a clear verdict, never a
pass in the history and never an impossible number in ``selected.json``; the installed bundle stays as it was.

On the ``local`` device (the same deploy/check path as SSH): a whole report then exit 137, negative / NaN /
unordered latencies, noise around the report (a shell line, a real ``sitecustomize``), a cut report; memory: the
worker OOM-killed in a memory cgroup (v2, or v1 where that is what the kernel has), the runner itself OOM-killed
there, ``ulimit -v`` at two sizes. Over real OpenSSH and Dropbear: the signal that killed a command is read (it
was "exit status -1"), and the runner OOM-killed as a whole is named over OpenSSH.
"""

from __future__ import annotations

import json
import math
import os
import pwd
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import NO_GATES
from tests.fixtures.cli import CliResult, run_edgetk
from tests.fixtures.deploy_helpers import write_inventory
from tests.fixtures.home import Home, new_home
from tests.fixtures.lying_python import LyingPython, lying_python, memory_cgroup, remove_cgroup
from toolkit.delivery.bundle import read_bundle
from toolkit.devices import open_connection, parse_spec
from toolkit.devices.spec import DeviceSpec

RUNS = ("--runs", "5", "--warmup", "1")


@dataclass(frozen=True)
class Field:
    python: LyingPython
    inventory: Path
    env: dict[str, str]
    bundle: Path
    installed: Path  # ~/.edgetk/bundles/<name> on the device

    def check(self, mode: str, cgroup: Path | None = None) -> CliResult:
        self.python.mode(mode, cgroup)
        return run_edgetk("check", self.bundle, "--inventory", self.inventory, *NO_GATES, *RUNS, "--json",
                          env=self.env)

    def history(self) -> list[dict[str, Any]]:
        """The history the CLI recorded to (read in this process: a CLI call per look costs seconds)."""
        from toolkit.store import Store

        return [{"check_id": row.check_id, "passed": row.passed, "p50_ms": row.p50_ms}
                for row in Store(Path(self.env["EDGETK_STORE"])).history()]

    def selected(self) -> dict[str, Any]:
        return dict(json.loads((self.installed / "selected.json").read_text()))


def _local_field(root: Path, real: Path, bundle: Path) -> Field:
    python = lying_python(root / "py", real)
    home = new_home(root)
    inventory = root / "inv.toml"
    inventory.write_text(f'[devices.here]\nhost = "local"\npython = "{python.path}"\n')
    deployed = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, *RUNS, "--json",
                          env=home.env)
    assert deployed.code == 0, deployed.stderr
    name = read_bundle(bundle).name
    return Field(python, inventory, home.env, bundle, home.path / ".edgetk" / "bundles" / name)


@pytest.fixture(scope="module")
def word(tmp_path_factory: pytest.TempPathFactory, device_env: Any, deploy_bundle_factory: Any) -> Field:
    return _local_field(tmp_path_factory.mktemp("word"), device_env.python,
                        deploy_bundle_factory(name="word", seed=33))


@pytest.fixture
def cgroup() -> Iterator[Any]:
    made: list[Path] = []

    def make(limit_mb: int, owner: int | None = None) -> Path:
        group = memory_cgroup(limit_mb, owner=owner)
        if group is None:
            pytest.skip("no memory cgroup can be made here (neither v2 memory.max nor v1 memory.limit_in_bytes)")
        made.append(group)
        return group

    yield make
    for group in made:
        remove_cgroup(group)


def _sane(selected: dict[str, Any]) -> None:
    """No impossible number in selected.json: every p50 is null or finite and positive."""
    for contender in selected["contenders"]:
        p50 = contender["p50_ms"]
        assert p50 is None or (math.isfinite(p50) and p50 > 0), selected
    assert selected["p50_ms"] is None or selected["p50_ms"] > 0


def _passes(history: list[dict[str, Any]]) -> int:
    return sum(1 for row in history if row["passed"])


def _whole_run_failure(field: Field, mode: str, *words: str, cgroup: Path | None = None) -> str:
    """``mode`` fails the check as a device error (exit 4) naming ``words``; nothing recorded, selection kept."""
    before, selected = field.history(), field.selected()
    result = field.check(mode, cgroup)
    assert result.code == 4, (result.code, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    (entry,) = result.json()["devices"]
    assert entry["reports"] == [] and not entry["ok"]
    for word in words:
        assert word in entry["error"], (word, entry["error"])
        assert word in result.stderr
    assert "Nothing was recorded" in entry["error"]
    assert field.history() == before  # nothing recorded, least of all a pass
    assert field.selected() == selected  # the selection stands
    return str(entry["error"])


def _artifact_failure(field: Field, mode: str, kind: str, cgroup: Path | None = None) -> dict[str, Any]:
    """``mode`` fails the check (exit 1) with one report whose error is ``kind``, recorded as a failure; the
    selection skips the artifact and says why, with no impossible number. The report is returned."""
    passes = _passes(field.history())
    result = field.check(mode, cgroup)
    assert result.code == 1, (result.code, result.stderr[-2000:])
    (entry,) = result.json()["devices"]
    (report,) = entry["reports"]
    assert report["error"]["kind"] == kind, report["error"]
    assert report["latency_ms"] is None and report["latency_samples_ms"] == [] and not report["gates"]["passed"]
    assert _passes(field.history()) == passes
    selected = field.selected()
    (contender,) = selected["contenders"]
    assert selected["artifact"] is None and contender["excluded"].startswith(f"the device cannot run it: {kind}")
    _sane(selected)
    return dict(report)


def test_a_run_that_dies_or_lies_is_no_pass(word: Field) -> None:
    field = word
    error = _whole_run_failure(field, "exit137", "exited with code 137", "SIGKILL",
                               "after printing a whole report")
    assert "not by the kernel's out-of-memory killer" in error
    crashed = _whole_run_failure(field, "exit3", "exited with code 3 after printing a whole report",
                                 "wrapper: giving up")
    assert "SIGKILL" not in crashed

    negative = _artifact_failure(field, "lie-negative", "bad_report")
    assert "latency_ms.mean is -1.0 (a latency must be positive)" in negative["error"]["message"]
    nan = _artifact_failure(field, "lie-nan", "bad_report")
    assert "latency_ms.p50 is NaN (a latency must be a finite number)" in nan["error"]["message"]
    unordered = _artifact_failure(field, "lie-unordered", "bad_report")
    assert "is above latency_ms.p99" in unordered["error"]["message"]
    assert "min <= p50 <= p90 <= p99 <= max" in unordered["error"]["message"]

    cut = _whole_run_failure(field, "cut", "report was cut after")
    assert "bad_report" not in cut  # the words, not the enum

    noisy = field.check("noise")
    assert noisy.code == 0, noisy.stderr[-2000:]
    for line in ("noise before the report", "sitecustomize says hello", "noise after"):
        assert line in noisy.stderr, noisy.stderr[-2000:]  # shown, not parsed
    (report,) = noisy.json()["devices"][0]["reports"]
    assert report["error"] is None and report["latency_ms"]["p50"] > 0
    _sane(field.selected())
    assert field.selected()["artifact"] == "model.fp32.onnx"


def test_out_of_memory_is_named(word: Field, cgroup: Any) -> None:
    field = word
    worker = _artifact_failure(field, "cgroup", "out_of_memory", cgroup(40))
    message = worker["error"]["message"]
    assert "ran out of memory on the device" in message and "OOM-kill count rose" in message, message
    assert "cgroup limit 40 MB" in message and "file 0.8 KB" in message and "peak seen" in message, message
    for advice in ("smaller artifact", "fewer threads", "free memory"):
        assert advice in worker["error"]["hint"]

    runner = _whole_run_failure(field, "runner-oom", "out of memory on the device", "killed by SIGKILL",
                                "OOM-kill count rose", "cgroup limit 100 MB", cgroup=cgroup(100))
    assert "model.fp32.onnx 0.8 KB" in runner and "peak the runner saw" in runner and "MemAvailable" in runner

    for kb, limit in (("60000", "ulimit -v 58.6 MB"), ("120000", "ulimit -v 117.2 MB")):
        starved = _artifact_failure(field, f"ulimit-{kb}", "out_of_memory")
        assert "ran out of memory on the device" in starved["error"]["message"], starved["error"]
        assert limit in starved["error"]["message"]

    again = field.check("as-is")  # the installed bundle was never touched: it checks clean
    assert again.code == 0, again.stderr[-2000:]
    assert field.selected()["artifact"] == "model.fp32.onnx"


def _spec(device: Any, key: Path, known_hosts: Path) -> DeviceSpec:
    base = parse_spec(device.spec)
    return DeviceSpec(name=base.name, host=base.host, port=base.port, user=base.user, identity_file=str(key),
                      known_hosts=str(known_hosts))


@pytest.mark.ssh
def test_the_signal_that_killed_a_command_is_read_over_openssh_and_dropbear(
        ssh_devices, ssh_client_key, ssh_known_hosts, dropbear_device, dropbear_client_key, dropbear_known_hosts):
    (openssh,) = ssh_devices(1)
    for spec in (_spec(openssh, ssh_client_key, ssh_known_hosts(openssh)),
                 _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device))):
        with open_connection(spec) as conn:
            killed = conn.run(["sh", "-c", "kill -KILL $$"], timeout=30)
            assert (killed.signal, killed.returncode, killed.ok) == ("SIGKILL", -9, False), (spec.port, killed)
            exited = conn.run(["sh", "-c", "exit 137"], timeout=30)
            assert (exited.signal, exited.returncode) == (None, 137), (spec.port, exited)


@pytest.mark.ssh
def test_the_runner_killed_out_of_memory_is_named_over_openssh(
        ssh_devices, ssh_client_key, ssh_known_hosts, device_env, deploy_bundle_factory, cgroup, tmp_path):
    (dev,) = ssh_devices(1)
    python = lying_python(dev.workdir / f"word-{tmp_path.name}", device_env.python)
    inventory = write_inventory(tmp_path / "inv.toml", [dev], python=str(python.path), key=ssh_client_key,
                                known_hosts=ssh_known_hosts(dev), names=["pi-oom"])
    env = Home(new_home(tmp_path).path).env
    bundle = deploy_bundle_factory(name="word", seed=33)
    group = cgroup(100, owner=pwd.getpwnam(dev.user).pw_uid)
    python.mode("runner-oom", group)
    result = run_edgetk("deploy", bundle, "--inventory", inventory, "--check", *NO_GATES, *RUNS, "--json", env=env)
    assert result.code == 4, result.stderr[-2000:]
    (entry,) = result.json()["devices"]
    assert entry["reports"] == [] and not entry["ok"]
    for word in ("out of memory on the device", "killed by SIGKILL", "OOM-kill count rose", "cgroup limit 100 MB"):
        assert word in entry["error"], entry["error"]
    installed = dev.home / ".edgetk" / "bundles" / read_bundle(bundle).name
    assert os.readlink(installed / "current") == read_bundle(bundle).version
    assert not (installed / "selected.json").exists()
    history = run_edgetk("history", "--json", env=env)
    assert history.code == 0 and history.json() == []
