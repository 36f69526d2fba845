"""push / rollback / status / remove through the API, on ``local`` and on real SSH devices."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.fixtures.cli import assert_clean_error, run_edgetk
from toolkit.delivery.bundle import read_bundle
from toolkit.delivery.deployment import Device, remove, rollback, status, validate_name
from toolkit.delivery.locks import DeviceLock
from toolkit.delivery.push import push
from toolkit.devices import DeviceSpec, open_connection, parse_spec
from toolkit.errors import DeviceError, UsageError
from toolkit.model.answers import RemoveAnswer, RollbackAnswer, StatusAnswer
from toolkit.delivery.locks import LockHeld


def _ssh_spec(dev, key, python=None):  # type: ignore[no-untyped-def]
    base = parse_spec(dev.spec)
    return DeviceSpec(name=dev.name, host=base.host, port=base.port, user=base.user, identity_file=str(key),
                      python=python)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_local_push_installs_verifies_and_resends_only_missing(local_home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    bundle = read_bundle(deploy_bundle_factory(name="tiny", target_arch="x86_64"))
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        first = push(device, bundle)
        assert first.files_sent == first.files_total == len(bundle.files())
        assert first.bytes_sent == first.bytes_total
        root = local_home / ".edgetk" / "bundles" / "tiny"
        assert os.readlink(root / "current") == bundle.version
        for f in bundle.files():
            installed = root / "current" / f.path
            assert _sha(installed) == f.sha256
            assert installed.stat().st_mode & 0o777 == 0o644
        for d in (local_home / ".edgetk", root, root / bundle.version):
            assert not d.stat().st_mode & 0o002  # nothing world-writable

        # an interrupted push: one file missing, one damaged -> only those two are sent again
        vdir = root / bundle.version
        (vdir / "model.fp32.onnx").unlink()
        (vdir / "golden" / "inputs.npz").write_bytes(b"partial")
        again = push(device, bundle)
        assert again.files_sent == 2
        assert again.bytes_sent == (bundle.path / "model.fp32.onnx").stat().st_size + (
            bundle.path / "golden" / "inputs.npz"
        ).stat().st_size
        assert _sha(vdir / "golden" / "inputs.npz") == _sha(bundle.path / "golden" / "inputs.npz")

        third = push(device, bundle)
        assert third.files_sent == 0 and third.bytes_sent == 0


def test_versions_rollback_keep_three_and_reuse(local_home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    bundles = [read_bundle(deploy_bundle_factory(name="multi", seed=i)) for i in range(4)]
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        for b in bundles:
            push(device, b)
        state = status(device).bundles["multi"]
        assert state.current == bundles[3].version
        assert [v.version for v in state.versions] == [b.version for b in bundles[1:]]
        root = local_home / ".edgetk" / "bundles" / "multi"
        assert not (root / bundles[0].version).exists()

        back = rollback(device, "multi")
        assert back == RollbackAnswer(current=bundles[2].version, previous=bundles[3].version)
        assert os.readlink(root / "current") == bundles[2].version

        # a damaged previous version is refused, current untouched
        (root / bundles[1].version / "model.fp32.onnx").write_bytes(b"broken")
        with pytest.raises(DeviceError, match="damaged"):
            rollback(device, "multi")
        assert os.readlink(root / "current") == bundles[2].version

        assert remove(device, "multi") == RemoveAnswer(removed="multi")
        assert not root.exists()
        with pytest.raises(UsageError, match="not installed"):
            remove(device, "multi")


def test_arch_mismatch_refused_unless_forced(local_home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    bundle = read_bundle(deploy_bundle_factory(name="armonly", target_arch="aarch64"))
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        with pytest.raises(UsageError, match="built for aarch64") as refused:
            push(device, bundle)
        assert refused.value.exit_code == 2
        assert not (local_home / ".edgetk" / "bundles" / "armonly").exists()
        assert push(device, bundle, force=True).files_sent > 0


def test_lock_serialises_deploys(local_home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    bundle = read_bundle(deploy_bundle_factory(name="locked"))
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        with DeviceLock(device, "locked", what="rollback"):
            with pytest.raises(LockHeld, match=r"a rollback of locked from .* \(pid \d+\) has held the lock") as held:
                push(device, bundle, lock_timeout=0.5)
            assert "--break-lock" in (held.value.hint or "") and held.value.exit_code == 4
            results = []
            waiter = threading.Thread(target=lambda: results.append(push(device, bundle, lock_timeout=30)))
            waiter.start()
            waiter.join(1.5)
            assert waiter.is_alive()  # waiting for our lock
        waiter.join(30)
        assert results and results[0].version == bundle.version
        assert results[0].lock.waited_for and "a rollback of locked" in results[0].lock.waited_for
        assert results[0].lock.broke is None
@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", ".hidden", "-rf", "a\nb"])
def test_bad_bundle_names_refused(name):  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError):
        validate_name(name)


@pytest.mark.ssh
def test_ssh_push_concurrent_deploys_and_hostile_name(ssh_devices, ssh_client_key, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    hostile = "evil; touch PWNED1 $(touch PWNED2) `touch PWNED3` 'q\" sp"
    bundle_a = read_bundle(deploy_bundle_factory(name=hostile, seed=10, pad_mb=4))
    bundle_b = read_bundle(deploy_bundle_factory(name=hostile, seed=11, pad_mb=4))
    spec = _ssh_spec(dev, ssh_client_key)
    known = dev.workdir / "client_known_hosts"
    known.write_text(dev.known_hosts_line())
    results: list[object] = []

    def deploy(b):  # type: ignore[no-untyped-def]
        with open_connection(spec, known_hosts=str(known)) as conn:
            results.append(push(Device(spec, conn), b))

    threads = [threading.Thread(target=deploy, args=(b,)) for b in (bundle_a, bundle_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 2, results
    root = dev.home / ".edgetk" / "bundles" / hostile
    current = os.readlink(root / "current")
    assert current in (bundle_a.version, bundle_b.version)
    installed = bundle_a if current == bundle_a.version else bundle_b
    for f in installed.files():
        assert _sha(root / current / f.path) == f.sha256
    for marker in ("PWNED1", "PWNED2", "PWNED3"):
        assert not (dev.home / marker).exists()
    assert not (dev.home / ".edgetk" / "locks" / hostile).exists()


def _counting(device: Device) -> list[tuple[str, dict]]:
    """Record every helper call of ``device`` with its answer (the device-side steps of a push)."""
    calls: list[tuple[str, dict]] = []
    helper = device.helper

    def counted(command, *args, **kwargs):  # type: ignore[no-untyped-def]
        answer = helper(command, *args, **kwargs)
        calls.append((command, answer))
        return answer

    device.helper = counted  # type: ignore[method-assign]
    return calls


def test_push_is_two_helper_calls_and_uploads_are_hashed_while_they_arrive(local_home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    bundle = read_bundle(deploy_bundle_factory(name="twocalls", pad_mb=2))
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        calls = _counting(device)
        result = push(device, bundle)
        assert [c for c, _ in calls] == ["begin", "finish"]
        assert result.files_sent == len(bundle.files())
        # every uploaded file was hashed on the device by begin's follower, none again by finish
        assert calls[1][1]["hashed"] == 0, calls[1][1]
        assert device.info()["arch"]  # begin's probe is kept: no extra info call
        assert [c for c, _ in calls] == ["begin", "finish"]
        assert not (local_home / ".edgetk" / "locks" / "twocalls").exists()
        for f in bundle.files():
            assert _sha(local_home / ".edgetk" / "bundles" / "twocalls" / "current" / f.path) == f.sha256


def _wait_followed(home: Path, name: str, rel: str) -> None:
    import json
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            state = json.loads((home / ".edgetk" / "locks" / name / "follow.json").read_text())
        except (OSError, ValueError):
            state = {}
        if rel in state.get("files", {}):
            return
        time.sleep(0.01)
    raise AssertionError("the follower never hashed " + rel)


@pytest.mark.parametrize("damage", ["in_transit", "after_it_was_hashed"])
def test_damaged_upload_is_refused_before_the_switch(local_home, deploy_bundle_factory, damage):  # type: ignore[no-untyped-def]
    """The device's sha256 check still catches a bad upload, whether the follower read the damage or the file
    changed after the follower hashed it (its stat differs: finish hashes it again)."""
    good = read_bundle(deploy_bundle_factory(name="damaged", seed=70))
    bad = read_bundle(deploy_bundle_factory(name="damaged", seed=71, pad_mb=1))
    spec = DeviceSpec(name="local")
    root = local_home / ".edgetk" / "bundles" / "damaged"
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        push(device, good)
        put = conn.put

        def damaging_put(local, remote, **kwargs):  # type: ignore[no-untyped-def]
            if remote.endswith("/model.fp32.onnx") and damage == "in_transit":
                data = bytearray(Path(local).read_bytes())
                data[len(data) // 2] ^= 1  # one bit flipped on the way: the device receives other bytes
                local = local_home.parent / "flipped.onnx"
                local.write_bytes(bytes(data))
            put(local, remote, **kwargs)
            if remote.endswith("/model.fp32.onnx") and damage == "after_it_was_hashed":
                _wait_followed(local_home, "damaged", "model.fp32.onnx")
                with open(local_home / remote, "ab") as handle:  # changed on the device once hashed
                    handle.write(b"\0")

        conn.put = damaging_put  # type: ignore[method-assign]
        with pytest.raises(DeviceError, match="do not match their sha256") as refused:
            push(device, bad)
        assert "model.fp32.onnx" in refused.value.message
        assert os.readlink(root / "current") == good.version  # never switched
        assert not (local_home / ".edgetk" / "locks" / "damaged").exists()  # finish released the lock
        conn.put = put  # type: ignore[method-assign]
        again = push(device, bad)  # the next push sends the damaged file again and goes through
        assert again.files_sent == 1 and os.readlink(root / "current") == bad.version


def test_host_failure_mid_upload_releases_the_lock(local_home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    bundle = read_bundle(deploy_bundle_factory(name="hostfail", seed=72))
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        device.install_helper()  # before put fails: the helper goes over the same put
        calls = _counting(device)
        put = conn.put

        def failing_put(local, remote, **kwargs):  # type: ignore[no-untyped-def]
            raise KeyboardInterrupt

        conn.put = failing_put  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            push(device, bundle)
        assert [c for c, _ in calls] == ["begin", "unlock"] and calls[1][1] == {"released": True}
        assert not (local_home / ".edgetk" / "locks" / "hostfail").exists()
        assert not (local_home / ".edgetk" / "bundles" / "hostfail" / "current").exists()
        conn.put = put  # type: ignore[method-assign]
        assert push(device, bundle, lock_timeout=1).version == bundle.version  # no lock left to wait for


def test_arch_refusal_comes_from_begin_before_anything_is_written(local_home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    bundle = read_bundle(deploy_bundle_factory(name="armbegin", target_arch="arm64"))
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        calls = _counting(device)
        with pytest.raises(UsageError, match="built for arm64"):
            push(device, bundle)
        assert [c for c, _ in calls] == []  # refused inside begin: no unlock needed, nothing written
        assert not (local_home / ".edgetk" / "bundles" / "armbegin").exists()
        assert not (local_home / ".edgetk" / "locks" / "armbegin").exists()


def test_device_helper_is_python_36_compatible(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from toolkit import device_side
    from toolkit.delivery.deployment import helper_boot

    vermin = Path(sys.executable).parent / "vermin"
    helper = device_side.source_path(device_side.HELPER_FILE)
    boot = tmp_path / "boot.py"  # the -c program that runs the helper from its compiled cache
    boot.write_text(helper_boot())
    for path in (helper, boot):
        result = subprocess.run([str(vermin), "--target=3.6-", "--no-tips", "--violations", str(path)],
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_refusal_the_helper_writes_is_one_host_word() -> None:
    """The helper writes its refusals as plain words (it cannot import toolkit); the host parses them into
    HelperRefusal where it reads the answer. Every kind the helper's ``fail`` and the boot program can write is a
    member, and every member is written there (a new refusal is one word on each side)."""
    import ast
    import re

    from toolkit import device_side
    from toolkit.delivery.deployment import _BOOT, refusal_of
    from toolkit.model.vocabulary import HelperRefusal

    kinds = set(re.findall(r'"kind": "(\w+)"', _BOOT))
    for func in ast.walk(ast.parse(device_side.source_path(device_side.HELPER_FILE).read_text())):  # its blocks
        if not isinstance(func, ast.FunctionDef):
            continue
        for call in ast.walk(func):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "fail"):
                continue
            first = call.args[0]  # a word, or a name assigned words in the same function
            values = [first] if not isinstance(first, ast.Name) else [
                node.value for node in ast.walk(func) if isinstance(node, ast.Assign)
                and any(isinstance(target, ast.Name) and target.id == first.id for target in node.targets)]
            kinds |= {node.value for value in values for node in ast.walk(value)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert {"helper_missing", "locked", "arch", "disk_full", "os_error"} <= kinds
    assert kinds == set(HelperRefusal.values())
    assert all(refusal_of({"kind": kind}) is HelperRefusal(kind) for kind in kinds)
    assert refusal_of({"kind": "from_a_newer_helper"}) is None and refusal_of({"error": "no kind"}) is None


def test_a_malformed_device_answer_is_one_plain_device_error(local_home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    """The helper's answers are read into their records once, where the host receives them: an answer that does
    not fit (here a history file on the device whose ``by`` someone rewrote as a string) is one DeviceError
    naming the key, not a KeyError in a renderer; the CLI prints it as the device's error (exit 4, one JSON
    document). A record asked of another command's answer is refused by its first unknown key."""
    bundle = read_bundle(deploy_bundle_factory(name="odd"))
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        push(device, bundle)
        state = status(device).bundles["odd"]
        assert state.current == bundle.version and state.versions[0].by is not None
        # the record writes the helper's document back as it came, key for key and in order (the --json contract)
        assert json.dumps(status(device).to_dict()) == json.dumps(device.helper("status"))
        with pytest.raises(DeviceError, match="the device's answer to 'info' does not read: unknown top-level key"):
            device.ask(StatusAnswer, "info")
        history = local_home / ".edgetk" / "bundles" / "odd" / ".history.json"
        entries = json.loads(history.read_text())
        entries[-1]["by"] = "someone"
        history.write_text(json.dumps(entries))
        with pytest.raises(DeviceError) as caught:
            status(device)
    assert caught.value.message == ("local: the device's answer to 'status' does not read: [bundles.odd]: the key "
                                    "'versions[0].by' must be a table, got a string ('someone').")
    result = run_edgetk("status", "--device", "local", "--json", env={"HOME": str(local_home)})
    assert_clean_error(result, 4, "the device's answer to 'status' does not read")
    (entry,) = result.json()["devices"]
    assert not entry["ok"] and "bundles" not in entry and "versions[0].by" in entry["error"]


def test_helper_compiled_cache_is_used_only_when_sound(local_home):  # type: ignore[no-untyped-def]
    """The device keeps the compiled helper; a damaged or group-writable cache is ignored and rewritten."""
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        assert status(device) == StatusAnswer(bundles={})
        (cache,) = (local_home / ".edgetk" / "helper").glob("*.bin")
        assert cache.stat().st_mode & 0o777 == 0o644
        good = cache.read_bytes()
        cache.write_bytes(good[:8] + b"\0" + good[9:])  # damaged: the CRC-32 no longer matches
        assert status(device) == StatusAnswer(bundles={})
        assert cache.read_bytes() == good
        cache.write_bytes(b"garbage")
        cache.chmod(0o666)  # someone else could have written it: never loaded, replaced
        assert status(device) == StatusAnswer(bundles={})
        assert cache.read_bytes() == good and cache.stat().st_mode & 0o777 == 0o644


def test_helper_is_installed_once_and_the_command_line_stays_small(local_home):  # type: ignore[no-untyped-def]
    """The helper is no longer sent with every call: installed once by its hash, then run by path. Linux caps
    one argument at 128 KiB and the whole remote command line is one `sh -c` argument over SSH."""
    from toolkit.delivery.deployment import helper_digest, helper_source

    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        device = Device(spec, conn)
        assert status(device) == StatusAnswer(bundles={})
        installed = local_home / ".edgetk" / "helper" / f"{helper_digest()[:32]}.py"
        assert installed.read_text() == helper_source()
        argv = device.helper_argv("status")
        line = " ".join(argv)
        assert len(line.encode()) < 4096, len(line)
        assert helper_source()[:2000] not in line
        installed.write_text(installed.read_text() + "\n# damaged\n")  # a wrong hash: reinstalled, not run
        for cache in installed.parent.glob("*.bin"):
            cache.unlink()
        assert status(device) == StatusAnswer(bundles={})
        assert installed.read_text() == helper_source()


@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed (scripts/test installs it)")
def test_an_install_is_on_the_storage_before_current_switches(local_home, deploy_bundle_factory, tmp_path):  # type: ignore[no-untyped-def]
    """A power cut right after the switch must not find files still in the page cache: the device's own system
    calls (strace on the helper's Python) show every file of the version and its directories fsynced before the
    rename(2) that switches ``current``, and the bundle directory fsynced right after it."""
    import sys

    log = tmp_path / "strace.log"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec strace -f -y -qq -e trace=fsync,rename,renameat,renameat2 -o {log} "
                       f"{sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    bundle = read_bundle(deploy_bundle_factory(name="durable", target_arch="x86_64", seed=71))
    spec = DeviceSpec(name="local", python=str(wrapper))
    with open_connection(spec) as conn:
        push(Device(spec, conn), bundle)
    calls = [line.split(None, 1)[1] for line in log.read_text().splitlines() if "(" in line]
    bdir = str(local_home / ".edgetk" / "bundles" / "durable")
    switch = next(i for i, c in enumerate(calls)
                  if c.startswith("rename") and '/bundles/durable/current"' in c)  # paths relative to the home
    synced = {c.split("<", 1)[1].split(">", 1)[0] for c in calls[:switch] if c.startswith("fsync(")}
    vdir = Path(bdir) / bundle.version
    for f in bundle.files():
        assert str(vdir / f.path) in synced, f"{f.path} was not fsynced before the switch"
    assert str(vdir) in synced and str(vdir / "golden") in synced
    assert calls[switch + 1].startswith("fsync(") and f"<{bdir}>" in calls[switch + 1], calls[switch:]


def test_progress_rates_count_bytes_sent_not_bytes_queued() -> None:
    """The first megabytes of a push go into buffers at once (an SSH window, a socket): a rate over them says
    nothing about the link. Here the link is a real pipe with a 1 MiB buffer drained at 1 MB/s: the first line
    (after a 1 MiB burst) gives no rate, the later ones about 1 MB/s (before: 3 MB/s on the first line)."""
    import fcntl
    import io
    import re
    import time

    from toolkit.delivery.deploy_wire import UploadProgress

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 1 << 20)  # F_SETPIPE_SZ: the "link's" buffer
    total = 4_000_000
    stream = io.StringIO()
    progress = UploadProgress("pi-1", total, stream=stream, interval=0.5)

    def drain() -> None:  # the far end takes 1 MB/s
        got = 0
        while got < total:
            block = os.read(read_end, 50_000)
            got += len(block)
            time.sleep(0.05)

    reader = threading.Thread(target=drain)
    reader.start()
    callback = progress.file_progress(0)
    sent = 0
    block = b"x" * 16_384
    while sent < total:
        sent += os.write(write_end, block[:total - sent])
        callback(sent, total)
    reader.join(30)
    progress.finish()
    os.close(read_end)
    os.close(write_end)
    lines = stream.getvalue().splitlines()
    rates = [float(m.group(1)) if (m := re.search(r"\(([\d.]+) MB/s\)", line)) else None for line in lines]
    assert rates[0] is None, lines  # the first line: the buffer filled, no rate to tell
    assert all(r is not None and 0.5 < r < 1.6 for r in rates[1:]), lines


def test_a_selection_for_a_bundle_with_no_current_version_is_refused(tmp_path: Path) -> None:
    """The helper's ``select`` on a bundle directory that no version was switched to (a first push cut short)
    refuses as ``not_current``, whatever version the selection names (none included), and writes nothing."""
    import json
    import subprocess
    import sys

    from toolkit import device_side
    from toolkit.delivery.deployment import helper_json

    bundle = tmp_path / ".edgetk" / "bundles" / "cut"
    (bundle / ("a" * 64)).mkdir(parents=True)  # a version's files, never switched to
    for version in (None, "a" * 64):
        result = subprocess.run([sys.executable, "-S", str(device_side.source_path(device_side.HELPER_FILE)),
                                 "select", "cut", json.dumps({"version": version, "artifact": None}), "", "5"],
                                cwd=tmp_path, env={**os.environ, "EDGETK_HOME": ".edgetk"}, capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 3, result.stdout + result.stderr
        answer = helper_json(result.stdout)
        assert answer is not None and answer["kind"] == "not_current", answer
    assert not (bundle / "selected.json").exists()
    assert not (tmp_path / ".edgetk" / "locks" / "cut").exists()  # the lock went with the refusal
