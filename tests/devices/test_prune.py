"""Old versions away, current kept (issue 24): ``edgetk prune`` and ``deploy --prune`` on the real Dropbear/busybox
stand-in (a small tmpfs disk), never removing the running version or the rollback target; status and rollback
keep working afterwards; the small-disk refusal names ``edgetk prune``, not ``edgetk remove``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.cli import run_edgetk
from tests.fixtures.dropbear import DropbearDevice
from toolkit import api
from toolkit.delivery.bundle import read_bundle
from toolkit.delivery.deployment import Device, rollback, status
from toolkit.delivery.push import push
from toolkit.devices import DeviceSpec, open_connection, parse_spec
from toolkit.errors import DeviceDiskFull

pytestmark = pytest.mark.dropbear


def _spec(device: DropbearDevice, key: Path) -> DeviceSpec:
    base = parse_spec(device.spec)
    return DeviceSpec(name=device.name, host=base.host, port=base.port, user=base.user, identity_file=str(key),
                      python=device.python)


def _versions(device: DropbearDevice, name: str) -> set[str]:
    root = device.home / ".edgetk" / "bundles" / name
    return {p.name for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")}


def test_prune_keeps_the_current_version_and_the_rollback_target(
        dropbear_device: DropbearDevice, dropbear_client_key: Path, dropbear_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Callable[..., Path], tmp_path: Path) -> None:
    known = dropbear_known_hosts(dropbear_device)
    spec = _spec(dropbear_device, dropbear_client_key)
    bundles = [read_bundle(deploy_bundle_factory(name="pruned", seed=60 + i, pad_mb=0.5)) for i in range(4)]
    v = [b.version for b in bundles]
    with open_connection(spec, known_hosts=str(known)) as conn:
        device = Device(spec, conn)
        for bundle in bundles:
            push(device, bundle)
        assert _versions(dropbear_device, "pruned") == set(v[1:])  # deploy keeps 3
        rollback(device, "pruned")  # current v2, rollback target v1; v3 is newer than the current one
    report = api.prune("pruned", keep=1, devices=[spec], known_hosts=known)
    entry = report.to_dict()["devices"][0]
    assert report.exit_code == 0, entry
    assert entry["removed"] == [v[3]] and entry["current"] == v[2] and entry["rollback_target"] == v[1]
    assert entry["kept"] == [v[1], v[2]] and entry["freed_bytes"] > 0
    pruned = report.devices[0].answer  # the same answer, typed
    assert pruned is not None and pruned.removed == (v[3],) and pruned.kept == (v[1], v[2])
    assert pruned.rollback_target == v[1] and pruned.freed_bytes == entry["freed_bytes"]
    assert _versions(dropbear_device, "pruned") == {v[1], v[2]}
    with open_connection(spec, known_hosts=str(known)) as conn:
        device = Device(spec, conn)
        state = status(device).bundles["pruned"]
        assert state.current == v[2] and [e.version for e in state.versions] == [v[1], v[2]]
        assert rollback(device, "pruned").current == v[1]  # the rollback target survived, verified
    # after that rollback v2 is newer than the current version: no rollback reaches it, so it goes
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(dropbear_device.inventory_entry(identity_file=str(dropbear_client_key),
                                                         python=dropbear_device.python))
    cli = run_edgetk("prune", "pruned", "--inventory", inventory, "--known-hosts", known, "--keep", "1", "--json")
    assert cli.code == 0, cli.stderr
    doc = cli.json()["devices"][0]
    assert doc["removed"] == [v[2]] and doc["current"] == v[1] and doc["kept"] == [v[1]]  # v2 was rolled back from


def test_small_disk_refusal_names_prune_and_deploy_prune_makes_room(
        fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path,
        dropbear_known_hosts: Callable[..., Path], deploy_bundle_factory: Callable[..., Path],
        tmp_path: Path) -> None:
    device = fresh_dropbear_device(home_mb=24)
    known = dropbear_known_hosts(device)
    spec = _spec(device, dropbear_client_key)
    bundles = [read_bundle(deploy_bundle_factory(name="roomy", seed=70 + i, pad_mb=4)) for i in range(4)]
    v = [b.version for b in bundles]
    with open_connection(spec, known_hosts=str(known)) as conn:
        dev = Device(spec, conn)
        for bundle in bundles[:3]:
            push(dev, bundle)
    filler = device.fill_home(leave_mb=3)
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(device.inventory_entry(identity_file=str(dropbear_client_key), python=device.python))
    refused = run_edgetk("deploy", bundles[3].path, "--inventory", inventory, "--known-hosts", known)
    assert refused.code == 4
    assert f"edgetk prune roomy --device {device.name}" in refused.stderr and "edgetk remove" not in refused.stderr
    assert _versions(device, "roomy") == set(v[:3])  # nothing removed by the refusal
    with open_connection(spec, known_hosts=str(known)) as conn:
        dev = Device(spec, conn)
        with pytest.raises(DeviceDiskFull):
            push(dev, bundles[3])
        done = push(dev, bundles[3], prune=True)
        assert done.pruned == (v[0],) and done.previous == v[2]
        assert _versions(device, "roomy") == {v[1], v[2], v[3]}
        assert rollback(dev, "roomy").current == v[2]  # the old current, kept as the rollback target
    filler.unlink()
