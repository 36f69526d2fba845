"""An OpenWrt/Buildroot/Yocto-class device (the stand-in of tests/fixtures/dropbear.py: real Dropbear 2022.83 with
no sftp-server, a busybox-only userland, a small disk) through the whole tool: probe, setup --offline, deploy,
check, status, rollback, over IPv4 and IPv6; pushes that never fail on fresh connections; the framed stream of
files that such a device gets instead of SFTP (resumed after a cut, compressed, hash-checked on arrival)."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cli import run_edgetk
from tests.fixtures.deploy_helpers import cutting_stream, push_recording_commands
from tests.fixtures.dropbear import DropbearDevice
from tests.fixtures.sshd import SshDevice
from tests.fixtures.home import Home
from toolkit.delivery import deployment, push
from toolkit.delivery.bundle import read_bundle
from toolkit.devices import open_connection
from toolkit.devices.host_facts import facts_path
from toolkit.devices.spec import DeviceSpec
from toolkit.errors import DeviceError, LinkDropped

pytestmark = pytest.mark.dropbear

NO_GATES = ("--budget-ms", "100000", "--baseline", "none")
FRESH_PUSHES = 200


def _spec(device: DropbearDevice, key: Path, known_hosts: Path, *, name: str = "openwrt") -> DeviceSpec:
    return DeviceSpec(name=name, host="127.0.0.1", port=device.port, user=device.user, identity_file=str(key),
                      known_hosts=str(known_hosts))


def _push(spec: DeviceSpec, bundle: Any, **options: Any) -> push.PushResult:
    conn = open_connection(spec)
    try:
        return push.push(deployment.Device(spec, conn), bundle, progress_stream=io.StringIO(), **options)
    finally:
        conn.close()


def _home_env(tmp_path: Path, key: Path, known: str) -> dict[str, str]:
    """A private HOME whose ~/.ssh holds the client key and the stand-in's host key, as a user's would."""
    home = tmp_path / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    shutil.copy(key, ssh / "id_ed25519")
    (ssh / "id_ed25519").chmod(0o600)
    (ssh / "known_hosts").write_text(known)
    cache = Path(os.environ.get("EDGETK_TEST_CACHE", tmp_path)) / "xdg-cache"  # setup's wheels, kept across runs
    return {**Home(home).env, "XDG_CACHE_HOME": str(cache)}


def test_fresh_pushes_without_sftp_never_fail(dropbear_device: DropbearDevice, dropbear_client_key: Path,
                                              dropbear_known_hosts: Callable[..., Path], deploy_bundle_factory: Any,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: about one fresh connection in ten ended with "the link to the device dropped" (5 of 60 here), as
    Dropbear ended connections whose SFTP request had failed when the next channel opened. Every push here opens
    a fresh connection and sends its files again (two versions, keep 1); every other one also forgets what it
    knew about the device, so it asks for SFTP again."""
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device))
    bundles = [read_bundle(deploy_bundle_factory(name="fresh", seed=seed)) for seed in (11, 12)]
    failures: list[str] = []
    for index in range(FRESH_PUSHES):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ("cache" if index % 2 else f"cache{index}")))
        try:
            result = _push(spec, bundles[index % 2], keep=1)
            assert result.files_sent >= 3, result  # the artifact and golden data (the runner may be linked)
        except DeviceError as exc:
            failures.append(f"{type(exc).__name__}: {exc.message}")
    assert failures == [], f"{len(failures)} of {FRESH_PUSHES} pushes failed: {failures[:3]}"
    facts = json.loads(facts_path().read_text())
    assert [entry["sftp"] for entry in facts.values()] == [False]  # asked once, remembered


def test_streamed_push_resumes_compresses_and_checks_on_arrival(
        dropbear_device: DropbearDevice, dropbear_client_key: Path, dropbear_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any, tmp_path: Path) -> None:
    from tests.test_deploy_compress import _sparse_bundle  # 80% zeros, as a pruned model's weights are

    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device))
    bundle = read_bundle(deploy_bundle_factory(name="streamed", pad_mb=3, seed=21))
    big = max(bundle.files(), key=lambda f: f.bytes)
    vdir = dropbear_device.home / ".edgetk" / "bundles" / "streamed" / bundle.version

    # a push cut short left the first 1.2 MB of the big file: only the rest is sent, the whole file verified
    vdir.mkdir(parents=True)
    partial = vdir / big.path
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes((bundle.path / big.path).read_bytes()[:1_200_000])
    owner = dropbear_device.home.stat()
    for path in [p for p in dropbear_device.home.joinpath(".edgetk").rglob("*")] + [dropbear_device.home / ".edgetk"]:
        os.chown(path, owner.st_uid, owner.st_gid)
    result = _push(spec, bundle)
    assert result.bytes_resumed == 1_200_000
    assert result.bytes_sent == result.bytes_total - 1_200_000
    assert (vdir / big.path).read_bytes() == (bundle.path / big.path).read_bytes()
    assert os.readlink(vdir.parent / "current") == bundle.version

    # compressed on the wire, inflated as it arrives: nothing left to inflate, the files are the bundle's
    again = read_bundle(_sparse_bundle(tmp_path / "sparse"))
    packed = _push(spec, again, compress=True)
    assert packed.files_compressed >= 1 and packed.bytes_sent < packed.bytes_uncompressed
    new_dir = dropbear_device.home / ".edgetk" / "bundles" / "sparse" / again.version
    for file in again.files():
        assert (new_dir / file.path).read_bytes() == (again.path / file.path).read_bytes()
    assert not list(new_dir.rglob("*.edgetk-gz"))


def test_a_push_cut_mid_stream_is_a_dropped_link_and_the_next_resumes(
        dropbear_device: DropbearDevice, dropbear_client_key: Path, dropbear_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection cut (its socket closed under it) once 3 MB of the stream went out: the push fails as a
    dropped link (closing the channel on the dead link raised a bare EOFError in about one run in seven), and
    the next push resumes the file from what arrived and installs it whole."""
    from toolkit.delivery import deploy_stream

    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device), name="cut")
    bundle = read_bundle(deploy_bundle_factory(name="cut", pad_mb=8, seed=44))
    big = max(bundle.files(), key=lambda f: f.bytes)
    conn = open_connection(spec)
    real_counted = deploy_stream.counted
    # the link goes, mid-push
    monkeypatch.setattr(deploy_stream, "counted",
                        cutting_stream(lambda: conn.transport().sock.close()))  # type: ignore[attr-defined]
    try:
        with pytest.raises(LinkDropped):
            push.push(deployment.Device(spec, conn), bundle, progress_stream=io.StringIO())
    finally:
        conn.close()
    monkeypatch.setattr(deploy_stream, "counted", real_counted)
    result = _push(spec, bundle)
    assert 0 < result.bytes_resumed < big.bytes
    current = dropbear_device.home / ".edgetk" / "bundles" / "cut" / "current"
    for file in bundle.files():
        assert (current / file.path).read_bytes() == (bundle.path / file.path).read_bytes()


def test_a_push_without_sftp_is_one_channel_and_one_device_side_run(
        dropbear_device: DropbearDevice, dropbear_client_key: Path, dropbear_known_hosts: Callable[..., Path],
        deploy_bundle_factory: Any) -> None:
    """begin's plan, the files and finish go over ONE session channel to ONE helper run (``push``): the fixed
    cost of a small push is one Python start on the device. A second push of the same bundle sends no file and
    is one run too; the version installed is the bundle's, hashed on the device."""
    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device))
    bundle = read_bundle(deploy_bundle_factory(name="onerun", seed=31))
    _push(spec, read_bundle(deploy_bundle_factory(name="onerun-warm", seed=32)))  # helper installed, SFTP known
    for expect_sent in (len(bundle.files()), 0):
        result, commands = push_recording_commands(spec, bundle)
        assert result.files_sent == expect_sent
        assert len(commands) == 1 and " push " in commands[0], commands
    current = dropbear_device.home / ".edgetk" / "bundles" / "onerun" / "current"
    for file in bundle.files():
        assert (current / file.path).read_bytes() == (bundle.path / file.path).read_bytes()
    assert not (dropbear_device.home / ".edgetk" / "locks" / "onerun").exists()


def test_a_file_damaged_on_the_way_is_refused_on_arrival(dropbear_device: DropbearDevice,
                                                         dropbear_client_key: Path,
                                                         dropbear_known_hosts: Callable[..., Path],
                                                         deploy_bundle_factory: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The device hashes each streamed file as it arrives: a listing whose sha256 does not match what came is
    refused (the push fails, the current version stays)."""
    from toolkit.delivery import deploy_stream

    spec = _spec(dropbear_device, dropbear_client_key, dropbear_known_hosts(dropbear_device))
    good = read_bundle(deploy_bundle_factory(name="damaged", seed=31))
    _push(spec, good)
    bad = read_bundle(deploy_bundle_factory(name="damaged", seed=32, pad_mb=0.1))
    real_frames = deploy_stream.frames

    def flip_one_byte(files: Any) -> Any:
        for block in real_frames(files):
            yield block[:-1] + bytes([block[-1] ^ 1]) if len(block) > 1000 else block

    monkeypatch.setattr(deploy_stream, "frames", flip_one_byte)
    with pytest.raises(DeviceError) as caught:
        _push(spec, bad)
    assert "sha256" in caught.value.message and not isinstance(caught.value, LinkDropped)
    current = dropbear_device.home / ".edgetk" / "bundles" / "damaged" / "current"
    assert os.readlink(current) == good.version


def test_probe_setup_deploy_check_status_rollback_over_ipv4_and_ipv6(
        fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path,
        deploy_bundle_factory: Any, tmp_path: Path) -> None:
    device = fresh_dropbear_device(home_mb=320)  # room for a venv with numpy and onnxruntime
    env = _home_env(tmp_path, dropbear_client_key, device.known_hosts_line() + device.known_hosts_line(ipv6=True))
    inventory = tmp_path / "inv.toml"
    inventory.write_text(device.inventory_entry(name="openwrt", ipv6=True, target="generic-x86_64"))

    probe = run_edgetk("devices", "probe", "--device", device.spec, "--json", env=env)
    assert probe.code == 0, probe.stderr
    found = probe.json()["devices"][0]["probe"]
    assert found["sftp"] is False and found["runtimes"]["numpy"]

    setup = run_edgetk("devices", "setup", "--inventory", inventory, "--offline", "--runtime", "onnxruntime",
                       "--json", env=env)
    assert setup.code == 0, setup.stderr
    done = setup.json()["devices"][0]["setup"]
    assert done["mode"] == "offline" and done["installed"]["onnxruntime"] and done["installed"]["numpy"]

    v1 = deploy_bundle_factory(name="edge", seed=41)
    v2 = deploy_bundle_factory(name="edge", seed=42)
    for bundle, where in ((v1, ("--device", device.spec6)), (v2, ("--inventory", inventory))):
        result = run_edgetk("deploy", bundle, *where, "--check", *NO_GATES, "--json", env=env)
        assert result.code == 0, result.stderr
        report = result.json()["devices"][0]["reports"][0]
        assert report["outputs_match"]["ok"] and report["runtime"]["name"] == "onnxruntime"
    version1 = result.json()["devices"][0]["deploy"]["previous"]

    status = run_edgetk("status", "--device", device.spec, "--json", env=env)
    assert status.code == 0, status.stderr
    assert "edge" in status.stdout
    back = run_edgetk("rollback", "edge", "--inventory", inventory, "--json", env=env)
    assert back.code == 0, back.stderr
    assert back.json()["devices"][0]["current"] == version1
    again = run_edgetk("check", v1, "--device", device.spec6, *NO_GATES, env=env)
    assert again.code == 0, again.stdout + again.stderr


def test_a_device_that_refuses_sessions_is_not_called_a_dropped_link(fresh_ssh_device: Callable[[], SshDevice],
                                                                     ssh_client_key: Path,
                                                                     ssh_known_hosts: Callable[..., Path]) -> None:
    """OpenSSH with ``MaxSessions 0`` takes the login and refuses every session channel: tried on a second
    fresh connection, then told as a refusal (not a network problem), naming the step."""
    device = fresh_ssh_device()
    device.stop()
    config = device._write_config()
    original = device._write_config
    device._write_config = lambda: (config.write_text(  # type: ignore[method-assign]
        original().read_text().replace("MaxSessions 100", "MaxSessions 0")), config)[1]
    device.start()
    spec = DeviceSpec(name="strict", host="127.0.0.1", port=device.port, user=device.user,
                      identity_file=str(ssh_client_key), known_hosts=str(ssh_known_hosts(device)))
    conn = open_connection(spec)
    try:
        with pytest.raises(DeviceError) as caught:
            conn.run(["true"])
    finally:
        conn.close()
    assert not isinstance(caught.value, LinkDropped)
    assert "refused a session for true on two connections" in caught.value.message


def test_a_disk_that_fills_during_the_stream_is_told_and_cleaned_up(
        fresh_dropbear_device: Callable[..., DropbearDevice], dropbear_client_key: Path,
        dropbear_known_hosts: Callable[..., Path], deploy_bundle_factory: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Something else fills the small flash after ``begin`` found room: the device refuses the rest of the stream
    at once (the host stops sending), the partial version is removed, the current one stays, and the message
    says the disk is full (not a dropped link)."""
    from toolkit.delivery import deploy_stream
    from toolkit.errors import DeviceDiskFull

    device = fresh_dropbear_device(home_mb=12)
    spec = _spec(device, dropbear_client_key, dropbear_known_hosts(device))
    first = read_bundle(deploy_bundle_factory(name="full", seed=51))
    _push(spec, first)
    second = read_bundle(deploy_bundle_factory(name="full", seed=52, pad_mb=4))
    real_frames = deploy_stream.frames

    def fill_first(files: Any) -> Any:
        device.fill_home(0.2)  # another process took the space between begin and the upload
        yield from real_frames(files)

    monkeypatch.setattr(deploy_stream, "frames", fill_first)
    with pytest.raises(DeviceDiskFull) as caught:
        _push(spec, second)
    assert "disk is full" in caught.value.message and "current version is untouched" in caught.value.message
    bundles = device.home / ".edgetk" / "bundles" / "full"
    assert os.readlink(bundles / "current") == first.version
    assert not (bundles / second.version).exists()
    assert not (device.home / ".edgetk" / "locks" / "full").exists()
