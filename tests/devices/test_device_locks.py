"""The deploy lock survives device clocks (issue 24): it is broken only when its holder is provably gone (another
boot, or its process dead or its pid reused), never by age while the holder lives, and on request (--break-lock);
a waiting controller says whom it waits for. Against ``local``, the device helper's own rules, and the real
Dropbear/busybox stand-in with its clock two days ahead and two days behind, two controllers at once."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.dropbear import DropbearDevice
from toolkit.delivery.bundle import read_bundle
from toolkit.delivery.deployment import Device, status
from toolkit.delivery.locks import DeviceLock
from toolkit.delivery.push import push
from toolkit.devices import DeviceSpec, open_connection, parse_spec
from toolkit.devices.connection import Connection
from toolkit.delivery.locks import LockHeld, replaced_note
from toolkit.device_side import HELPER_FILE, source_path


def _helper() -> Any:
    """The device helper as a module (it is a standalone script; the host never imports it)."""
    spec = importlib.util.spec_from_file_location("edgetk_device_helper", source_path(HELPER_FILE))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start_of(pid: int) -> str:
    data = Path(f"/proc/{pid}/stat").read_text()
    return data[data.rindex(")") + 2:].split()[19]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_holder_rules_without_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    helper = _helper()
    me = {"pid": os.getpid(), "start": _start_of(os.getpid())}
    boot = _boot_id()
    assert helper.holder_gone({"boot_id": boot, "holder": me, "time": 0})[0] is False  # ancient by the clock: alive
    assert helper.holder_gone({"boot_id": "another-boot", "holder": me})[0] is True
    assert helper.holder_gone({"boot_id": boot, "holder": {"pid": _dead_pid(), "start": "1"}})[0] is True
    assert helper.holder_gone({"boot_id": boot, "holder": {"pid": os.getpid(), "start": "1"}})[0] is True  # reused
    assert helper.holder_gone({"boot_id": boot})[0] is None  # no holder recorded: never broken by itself
    # a device without a boot id: judged by pid and start time alone (a live holder is still never broken)
    monkeypatch.setattr(helper, "boot_id", lambda: None)
    assert helper.holder_gone({"boot_id": boot, "holder": me})[0] is False
    assert helper.holder_gone({"holder": {"pid": _dead_pid(), "start": "1"}})[0] is True
    # ... and without /proc at all: a dead pid is gone, a live one is kept (its start cannot be compared)
    real_isdir = os.path.isdir
    monkeypatch.setattr(helper.os.path, "isdir", lambda p: False if p == "/proc/self" else real_isdir(p))
    assert helper.holder_gone({"holder": {"pid": _dead_pid(), "start": None}})[0] is True
    assert helper.holder_gone({"holder": {"pid": os.getpid(), "start": None}})[0] in (False, None)


def test_a_lock_taken_again_since_it_was_judged_is_put_back(tmp_path: Path) -> None:
    """Two waiters judge the same dead holder; the first breaks it and takes the lock; the second's break must
    not remove that fresh lock (it finds another owner after its rename and puts it back)."""
    helper = _helper()
    lock = tmp_path / "locks" / "name"
    lock.mkdir(parents=True)
    (lock / "owner.json").write_text(json.dumps({"token": "fresh"}))
    assert helper.break_lock(str(lock), "second", {"token": "dead"}) is False
    assert json.loads((lock / "owner.json").read_text())["token"] == "fresh"
    assert helper.break_lock(str(lock), "second", None) is False  # judged without a record: it has one now
    assert helper.break_lock(str(lock), "second", {"token": "fresh"}) is True and not lock.exists()
    assert not list((tmp_path / "locks").iterdir())


def _plant_lock(home: Path, name: str, owner: dict[str, Any], *, ancient: bool = True) -> Path:
    lock = home / ".edgetk" / "locks" / name
    lock.mkdir(parents=True)
    (lock / "owner.json").write_text(json.dumps({"token": "planted", "what": "deploy", **owner}))
    if ancient:  # by the wall clock this lock is 56 years old: age must not matter
        os.utime(lock / "owner.json", (0, 0))
        os.utime(lock, (0, 0))
    return lock


def test_local_lock_broken_only_when_its_holder_is_gone(local_home: Path, deploy_bundle_factory: Callable[..., Path]
                                                        ) -> None:
    home = local_home
    bundle = read_bundle(deploy_bundle_factory(name="held"))
    spec = DeviceSpec(name="local")
    me = {"pid": os.getpid(), "start": _start_of(os.getpid())}
    by = {"host": "controller-a", "pid": 4242, "user": "ops"}
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        _plant_lock(home, "held", {"boot_id": _boot_id(), "holder": me, "by": by, "version": "ab" * 32})
        with pytest.raises(LockHeld, match=r"a deploy of held \(version abababababab\) from ops@controller-a "
                                           r"\(pid 4242\) has held the lock.*still runs") as held:
            push(device, bundle, lock_timeout=0.5)
        assert "--break-lock" in (held.value.hint or "")
        stream = io.StringIO()
        broken = push(device, bundle, break_lock=True, progress_stream=stream)
        assert broken.lock.broke and "from ops@controller-a (pid 4242)" in broken.lock.broke
        assert "--break-lock" in broken.lock.broke

        for owner, why in (({"boot_id": _boot_id(), "holder": {"pid": _dead_pid(), "start": "7"}}, "is gone"),
                           ({"boot_id": "an-earlier-boot", "holder": me}, "rebooted")):
            _plant_lock(home, "held", {**owner, "by": by})
            again = push(device, bundle, lock_timeout=5)
            assert again.lock.broke and why in again.lock.broke and again.lock.waited_for is None


def _ssh_device(device: DropbearDevice, key: Path, known_hosts: Path) -> tuple[DeviceSpec, Connection]:
    base = parse_spec(device.spec)
    spec = DeviceSpec(name=device.name, host=base.host, port=base.port, user=base.user, identity_file=str(key),
                      python=device.python)
    return spec, open_connection(spec, known_hosts=str(known_hosts))


@pytest.mark.dropbear
@pytest.mark.parametrize("clock", ["+2d", "-2d"])
def test_live_lock_survives_a_wrong_clock_and_a_dead_one_does_not(
        clock: str, fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path,
        dropbear_known_hosts: Callable[..., Path], deploy_bundle_factory: Callable[..., Path]) -> None:
    device = fresh_dropbear_device(clock=clock, home_mb=32)
    known = dropbear_known_hosts(device)
    bundles = [read_bundle(deploy_bundle_factory(name="clocked", seed=40 + i, pad_mb=2)) for i in range(2)]
    spec_a, conn_a = _ssh_device(device, dropbear_client_key, known)
    spec_b, conn_b = _ssh_device(device, dropbear_client_key, known)
    with conn_a, conn_b:
        a, b = Device(spec_a, conn_a), Device(spec_b, conn_b)
        holder = DeviceLock(a, "clocked")
        holder.__enter__()  # controller A holds the lock over its own connection (a live dropbear session)
        # the lock files carry the true time while the device clock is two days off: age says nothing
        with pytest.raises(LockHeld, match=r"a deploy of clocked from .+ \(pid \d+\) has held the lock"):
            push(b, bundles[0], lock_timeout=2)
        owner = json.loads((device.home / ".edgetk" / "locks" / "clocked" / "owner.json").read_text())
        assert owner["token"] == holder.token  # still A's: never broken while A lives
        assert owner["boot_id"] == _boot_id()

        stream = io.StringIO()
        results: list[Any] = []
        waiter = threading.Thread(target=lambda: results.append(
            push(b, bundles[0], lock_timeout=60, progress_stream=stream)))
        waiter.start()
        waiter.join(2.5)
        assert waiter.is_alive()
        assert f"{device.name}: waiting for a deploy of clocked from " in stream.getvalue()
        holder.__exit__(None, None, None)
        waiter.join(60)
        assert results and results[0].lock.waited_for and results[0].lock.broke is None

    # controller A dies without unlocking: its connection (the holder) is gone, so B breaks the lock at once
    spec_a, conn_a = _ssh_device(device, dropbear_client_key, known)
    with conn_a:
        DeviceLock(Device(spec_a, conn_a), "clocked").__enter__()
    spec_b, conn_b = _ssh_device(device, dropbear_client_key, known)
    with conn_b:
        after = push(Device(spec_b, conn_b), bundles[1], lock_timeout=30)
    assert after.lock.broke and "is gone" in after.lock.broke
    assert after.lock.waited_s < 20


@pytest.mark.dropbear
def test_two_controllers_at_once_on_a_clock_two_days_ahead(
        fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path,
        dropbear_known_hosts: Callable[..., Path], deploy_bundle_factory: Callable[..., Path]) -> None:
    device = fresh_dropbear_device(clock="+2d", home_mb=48)
    known = dropbear_known_hosts(device)
    bundles = [read_bundle(deploy_bundle_factory(name="twice", seed=50 + i, pad_mb=3)) for i in range(2)]
    connections = [_ssh_device(device, dropbear_client_key, known) for _ in range(3)]
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    streams = [io.StringIO(), io.StringIO()]

    def deploy(index: int) -> None:
        spec, conn = connections[index]
        try:
            results[index] = push(Device(spec, conn), bundles[index], lock_timeout=120,
                                  progress_stream=streams[index])
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    try:
        gate = DeviceLock(Device(*connections[2]), "twice")
        gate.__enter__()  # both controllers start while the lock is held, then race for it
        threads = [threading.Thread(target=deploy, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for stream in streams:
            while "waiting for" not in stream.getvalue() and any(t.is_alive() for t in threads):
                threads[0].join(0.1)
        gate.__exit__(None, None, None)
        for thread in threads:
            thread.join(180)
    finally:
        for _, conn in connections:
            conn.close()
    assert not errors, errors
    assert len(results) == 2 and all(r.lock.waited_for for r in results.values())  # both waited for the gate
    last = next(r for r in results.values() if r.previous is not None)
    first = next(r for r in results.values() if r is not last)
    assert first.previous is None and last.previous == first.version  # serialized: the later replaced the earlier
    # whom the later one names depends on when its second wait began: while the first held the lock (then with
    # the first's version), or after the first was done (then the gate, which carries no version)
    assert last.lock.waited_for and last.lock.waited_for.startswith("a deploy of twice "), last.lock.waited_for
    if "(version " in last.lock.waited_for:
        assert f"a deploy of twice (version {first.version[:12]}) from " in last.lock.waited_for
    assert last.lock.waited_for.endswith(f"(pid {os.getpid()})") and last.lock.broke is None
    assert last.previous_by and f"(pid {os.getpid()})" in last.previous_by
    spec, conn = _ssh_device(device, dropbear_client_key, known)
    with conn:
        dev = Device(spec, conn)
        assert status(dev).bundles["twice"].current == last.version
        note = replaced_note(dev, "twice", first.version)
        assert note and f"was replaced by {last.version[:12]} from " in note
        assert replaced_note(dev, "twice", last.version) is None


def _gated_python(device: DropbearDevice, gate: str) -> str:
    """A python3 on the device whose runner checks wait until the file ``gate`` exists in the home: a controller
    held in its check while other controllers deploy (the helper's steps go straight through)."""
    wrapper = device.home / f"python-{gate}"
    wrapper.write_text(f'#!/bin/busybox sh\ncase "$*" in *"edgetk_runner.py check"*)\n'
                       f'  while [ ! -e {device.home}/{gate} ]; do sleep 0.1; done;;\nesac\n'
                       f'exec {device.env.python} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.mark.dropbear
@pytest.mark.parametrize(("clock", "controllers"), [(None, 3), ("+2d", 2), ("-2d", 2)])
def test_a_controller_whose_version_was_replaced_names_what_and_who(
        clock: str | None, controllers: int, fresh_dropbear_device: Callable[..., DropbearDevice],
        dropbear_client_key: Path, deploy_bundle_factory: Callable[..., Path], tmp_path: Path) -> None:
    """Controllers deploy --check versions of one bundle, each starting while the earlier ones are still in their
    checks (held there by a gated python). Before: the earlier ones exited 4 with "the selection is for version
    X, but Y is installed", naming neither who nor what happened. Now each earlier one says which version
    replaced its own, from which host and pid, and that the newer check decides (exit 4, its selection not
    written); the last one selects, and selected.json is for the installed version."""
    import socket
    import sys

    from tests.fixtures.cli import REPO
    from tests.fixtures.home import Home

    device = fresh_dropbear_device(clock=clock, home_mb=32)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    key = home / ".ssh" / "id_ed25519"
    key.write_bytes(dropbear_client_key.read_bytes())
    key.chmod(0o600)
    (home / ".ssh" / "known_hosts").write_text(device.known_hosts_line())
    env = {**os.environ, **Home(home).env}
    bundles = [deploy_bundle_factory(name="raced", seed=80 + i) for i in range(controllers)]
    versions = [read_bundle(b).version for b in bundles]
    current = device.home / ".edgetk" / "bundles" / "raced" / "current"
    procs: list[subprocess.Popen[str]] = []
    for index, bundle in enumerate(bundles):
        last = index == controllers - 1
        extra = {} if last else {"python": _gated_python(device, f"go{index}")}
        inventory = tmp_path / f"inv{index}.toml"
        inventory.write_text(device.inventory_entry(name="racer", **extra))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "toolkit.cli", "deploy", bundle, "--inventory", inventory, "--check",
             "--runs", "3", "--warmup", "0", "--budget-ms", "100000", "--baseline", "none", "--json"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        if not last:  # the next controller starts once this one's version is current (it is now checking)
            for _ in range(600):
                if os.path.islink(current) and os.readlink(current) == versions[index]:
                    break
                assert procs[-1].poll() is None, procs[-1].communicate()
                threading.Event().wait(0.1)
    out, err = procs[-1].communicate(timeout=240)
    assert procs[-1].returncode == 0, err
    for index in range(controllers - 1):  # the held checks go on now, the latest first
        gate = controllers - 2 - index
        (device.home / f"go{gate}").touch()
        out, err = procs[gate].communicate(timeout=240)
        assert procs[gate].returncode == 4, out + err
        error = json.loads(out)["devices"][0]["error"]
        winner = versions[-1]
        assert (f"version {versions[gate][:12]} of raced was replaced by {winner[:12]} (deploy from "
                f"{socket.gethostname()}, pid {procs[-1].pid}) before its check finished; {winner[:12]}'s check "
                "decides") in error, error
    assert os.readlink(current) == versions[-1]
    selected = json.loads((current.parent / "selected.json").read_text())
    assert selected["version"] == versions[-1]
    assert not (device.home / ".edgetk" / "locks" / "raced").exists()


def test_a_selection_waits_for_a_push_in_progress_and_then_names_it(
        local_home: Path, deploy_bundle_factory: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The selection's compare-and-swap runs under the bundle's lock: while another controller's deploy holds it
    (longer than the selection waits), this check's selection is not written and the error names that deploy;
    once the lock is free, it is written."""
    from toolkit.checks import selection as choosing
    from toolkit.errors import VersionReplaced

    bundle = read_bundle(deploy_bundle_factory(name="pending"))
    spec = DeviceSpec(name="local")
    by = {"host": "controller-b", "pid": 4343, "user": "ops"}
    me = {"pid": os.getpid(), "start": _start_of(os.getpid())}
    monkeypatch.setattr(choosing, "SELECT_WAIT_S", 1.0)
    chosen = choosing.Selection(device="local", bundle="pending", version=bundle.version, artifact=None,
                                reason="nothing passes")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        push(device, bundle)
        _plant_lock(local_home, "pending", {"boot_id": _boot_id(), "holder": me, "by": by, "version": "cd" * 32})
        with pytest.raises(VersionReplaced, match=r"version \w{12} of pending is being replaced by a deploy of "
                                                  r"pending \(version cdcdcdcdcdcd\) from ops@controller-b "
                                                  r"\(pid 4343\)"):
            choosing.write_selection(device, "pending", chosen)
        selected = local_home / ".edgetk" / "bundles" / "pending" / "selected.json"
        assert not selected.exists()
        shutil.rmtree(local_home / ".edgetk" / "locks" / "pending")
        choosing.write_selection(device, "pending", chosen)
        assert json.loads(selected.read_text())["version"] == bundle.version
