"""Staged rollouts: wave sizes, the failure threshold, and a real rollout over loopback sshd devices that stops
at a failing wave and rolls the updated devices back (few devices: the 200-device curve is in scripts/bench)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.devices.spec import DeviceSpec
from toolkit.errors import UsageError
from toolkit.api.fleet import DeviceSelection
from toolkit.api.rollout import FailureLimit, JobOptions, WavePlan, deploy_in_waves, prepare_job
from toolkit.model.options import CheckOptions, DeviceOptions


def test_wave_sizes_follow_ansible_serial() -> None:
    assert WavePlan.parse("1,10%,100%").batches(10) == [1, 1, 8]
    assert WavePlan.parse("1,10%").batches(25) == [1, 3, 3, 3, 3, 3, 3, 3, 3]  # the last size repeats
    assert WavePlan.parse("5").batches(3) == [3]
    assert WavePlan.parse("1,50%").batches(200)[:3] == [1, 100, 99]
    assert sum(WavePlan.parse("2,7%").batches(201)) == 201
    for bad in ("", "0", "abc", "150%", "1,-2"):
        with pytest.raises(UsageError):
            WavePlan.parse(bad)


def test_failure_threshold_is_more_than() -> None:
    five = FailureLimit.parse("5%")
    assert not five.exceeded(1, 20) and five.exceeded(2, 20) and five.exceeded(1, 1)
    assert FailureLimit.parse("2").exceeded(3, 100) and not FailureLimit.parse("2").exceeded(2, 3)
    assert FailureLimit().exceeded(1, 100) and not FailureLimit().exceeded(0, 1)


def _specs(devices, key: Path, known: Path, python: str, broken: int) -> list[DeviceSpec]:  # type: ignore[no-untyped-def]
    return [
        DeviceSpec(name=f"d{i}", host="127.0.0.1", port=d.port, user=d.user, identity_file=str(key),
                   known_hosts=str(known), python="/usr/bin/python3" if i == broken else python)
        for i, d in enumerate(devices)
    ]


@pytest.mark.ssh
def test_a_failing_wave_stops_the_rollout_and_rolls_back(ssh_devices, ssh_client_key, ssh_known_hosts,  # type: ignore[no-untyped-def]
                                                         deploy_bundle_factory, device_python, tmp_path):
    from toolkit.delivery.deployment import Device, installed_version
    from toolkit.devices import open_connection
    from toolkit.devices.fleet import run_fleet

    devices = ssh_devices(4)
    specs = _specs(devices, ssh_client_key, ssh_known_hosts(*devices), device_python, broken=1)
    old = deploy_bundle_factory(name="waves", seed=0)
    new = deploy_bundle_factory(name="waves", seed=1)
    gates = CheckOptions(runs=3, warmup=1, budget_ms=100000.0, baseline="none", regression_pct=10.0,
                         store=str(tmp_path / "h.sqlite"))
    fleet = DeviceSelection(tuple(specs), DeviceOptions(parallel=4))  # what `edgetk deploy --waves` runs on
    first = prepare_job(old, JobOptions(install=True, check=False), gates)
    result = deploy_in_waves(first, specs, run_on=fleet.run_batch, plan=WavePlan.parse("100%"),
                             max_failures=FailureLimit(), rollback_on_failure=False)
    assert result.stopped is None and [w.devices for w in result.waves] == [("d0", "d1", "d2", "d3")]
    old_version = first.bundle.version

    job = prepare_job(new, JobOptions(install=True, check=True), gates)
    assert job.bundle.version != old_version
    result = deploy_in_waves(job, specs, run_on=fleet.run_batch, plan=WavePlan.parse("1,1,100%"),
                             max_failures=FailureLimit.parse("0"), rollback_on_failure=True)
    assert [(w.devices, w.failed) for w in result.waves] == [(("d0",), ()), (("d1",), ("d1",))]
    assert result.stopped and "wave 2" in result.stopped and result.not_started == ("d2", "d3")
    assert sorted(o.device for o in result.rolled_back) == ["d0", "d1"] and all(o.ok for o in result.rolled_back)
    doc = result.to_dict()
    assert doc["waves"][1]["failed_pct"] == 100.0

    def current(spec: DeviceSpec) -> str | None:
        with open_connection(spec) as conn:
            return installed_version(Device(spec, conn), "waves")

    versions = run_fleet(specs, current, parallel=4)
    assert [o.value for o in versions.outcomes] == [old_version] * 4  # rolled back, or never touched
    stored = job.store_status()
    assert stored is not None and stored.ok and stored.recorded >= 1
