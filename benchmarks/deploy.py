"""Section ``deploy`` (issues 5 and 24): pushing a 50 MB bundle to real loopback sshd devices; then push speed vs
``ssh cat``/``scp -O``/``scp`` on an OpenSSH and a Dropbear device (benchmarks/deploy_transports.py).

Three ways of moving the same 50 MB ONNX artifact, each including its own connection and authentication,
timed interleaved: ``toolkit.delivery.push.push`` (begin: lock and prepare, SFTP upload, sha256 verified on the
device, finish: atomic switch of ``current``), a raw paramiko SFTP ``put``, and OpenSSH ``scp``. Then 8 devices in parallel vs one
after another through ``toolkit.devices.fleet.run_fleet``. The devices are the test suite's
(tests/fixtures/sshd.py: one sshd and one Unix user per device, on 127.0.0.1); needs root.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from benchmarks import deploy_transports
from benchmarks.common import log, table, work_dir

TITLE = "Deploy: pushing bundles over SSH (issue 5)"
SIZE_MB = 50
DEVICES = 8
ROUNDS = 5
FLEET_ROUNDS = 2
PARAMIKO_SFTP = "edgetk push over paramiko SFTP (the route under the ssh client's threshold)"


def _bundle(root: Path) -> Path:
    from tests.fixtures.bundles import make_big_onnx, write_bundle

    path = root / f"big-{SIZE_MB}mb"
    if not (path / "manifest.json").is_file():
        shutil.rmtree(path, ignore_errors=True)
        x = np.random.default_rng(1).standard_normal((4, 1, 16), dtype=np.float32)
        write_bundle(path, files=[("model.fp32.onnx", make_big_onnx(SIZE_MB))], golden_inputs=[x],
                     name=f"big-{SIZE_MB}mb")
    return path


def run() -> tuple[str, dict[str, Any]]:
    from tests.fixtures.sshd import SSHD, _Farm, _keygen

    parts = [f"## {TITLE}", ""]
    if os.geteuid() != 0 or not SSHD.exists() or shutil.which("scp") is None:
        parts.append("Not measured: needs root, /usr/sbin/sshd and scp (scripts/test installs them).")
        return "\n".join(parts), {}
    subprocess.run(["install", "-d", "-m755", "/run/sshd"], check=True)
    root = Path(tempfile.mkdtemp(prefix="edgetk-bench-sshd-"))
    root.chmod(0o755)
    key = root / "client_key"
    _keygen(key)
    farm = _Farm(root, key.with_name("client_key.pub").read_text())
    try:
        devices = [farm.make(f"bench{i}") for i in range(DEVICES)]
        known_hosts = root / "known_hosts"
        known_hosts.write_text("".join(d.known_hosts_line() for d in devices))
        bundle_dir = _bundle(work_dir() / "deploy")
        text, headline = _measure(parts, devices, key, known_hosts, bundle_dir)
        extra, figures = deploy_transports.measure(devices[0], key, known_hosts)
        return text + "\n\n" + "\n".join(extra), {**headline, **figures}
    finally:
        farm.close()


def _measure(parts: list[str], devices: list[Any], key: Path, known_hosts: Path,
             bundle_dir: Path) -> tuple[str, dict[str, Any]]:
    import paramiko

    from toolkit.delivery import deployment
    from toolkit.delivery.push import push as push_bundle
    from toolkit.delivery.bundle import read_bundle
    from toolkit.devices import open_connection, ssh_client
    from toolkit.devices.fleet import run_fleet
    from toolkit.devices.spec import DeviceSpec

    bundle = read_bundle(bundle_dir)
    artifact = bundle_dir / "model.fp32.onnx"
    artifact_bytes = artifact.stat().st_size
    total_bytes = sum(f.bytes for f in bundle.files())

    def spec(d: Any) -> DeviceSpec:
        return DeviceSpec(name=d.name, host="127.0.0.1", port=d.port, user=d.user, identity_file=str(key),
                          known_hosts=str(known_hosts))

    helper_calls: list[str] = []

    def toolkit_push(d: Any, *, client: bool = True) -> Any:
        """One push as shipped (``client``: a bundle this large streams through the ssh client), or kept on
        paramiko's SFTP (the route of bundles under ``SSH_CLIENT_MIN_BYTES``, whose steps the text below counts)."""
        if not client:
            with mock.patch.object(ssh_client, "SSH_CLIENT_MIN_BYTES", 1 << 62):
                return toolkit_push(d)
        s = spec(d)
        conn = open_connection(s)
        device = deployment.Device(s, conn)
        helper = device.helper

        def counted(command: str, *args: str, **kwargs: Any) -> Any:
            helper_calls.append(command)
            return helper(command, *args, **kwargs)

        device.helper = counted  # type: ignore[method-assign]  # count the device-side steps of one push
        try:
            return push_bundle(device, bundle, progress_stream=io.StringIO())
        finally:
            conn.close()

    def helper_round_trip(d: Any) -> float:
        s = spec(d)
        conn = open_connection(s)
        try:
            device = deployment.Device(s, conn)
            device.helper("info")  # connect first
            times = []
            for _ in range(5):
                begin = time.perf_counter()
                device.helper("info")
                times.append(time.perf_counter() - begin)
            return statistics.median(times)
        finally:
            conn.close()

    def toolkit_remove(d: Any) -> None:
        s = spec(d)
        conn = open_connection(s)
        try:
            deployment.remove(deployment.Device(s, conn), bundle.name)
        except Exception:  # noqa: BLE001, S110 - nothing installed yet
            pass
        finally:
            conn.close()

    def toolkit_put(d: Any) -> None:
        """Only the toolkit's file transfer (its SFTP window and pipelining), no device-side steps."""
        s = spec(d)
        conn = open_connection(s)
        try:
            conn.put(artifact, "raw_toolkit.bin")
        finally:
            conn.close()

    def sftp_put(d: Any) -> None:
        client = paramiko.SSHClient()
        client.load_host_keys(str(known_hosts))
        client.connect("127.0.0.1", port=d.port, username=d.user, key_filename=str(key), look_for_keys=False,
                       allow_agent=False)
        try:
            sftp = client.open_sftp()
            sftp.put(str(artifact), "raw_sftp.bin")
            sftp.close()
        finally:
            client.close()

    def scp_put(d: Any) -> None:
        subprocess.run(["scp", "-q", "-i", str(key), "-P", str(d.port), "-o", f"UserKnownHostsFile={known_hosts}",
                        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", str(artifact),
                        f"{d.user}@127.0.0.1:raw_scp.bin"], check=True, capture_output=True)

    def forget_helper(d: Any) -> None:
        """Make the device new to the toolkit: its installed helper (and compiled copy) removed."""
        s = spec(d)
        conn = open_connection(s)
        try:
            conn.run(["rm", "-rf", deployment.HELPER_DIR])
        finally:
            conn.close()

    device = devices[0]
    first_push = "edgetk push, first to the device (installs the helper)"
    variants: dict[str, Callable[[], Any]] = {
        "edgetk push (toolkit)": lambda: toolkit_push(device),
        PARAMIKO_SFTP: lambda: toolkit_push(device, client=False),
        first_push: lambda: toolkit_push(device),
        "toolkit transfer only (`SshConnection.put`)": lambda: toolkit_put(device),
        "paramiko SFTP put (raw)": lambda: sftp_put(device),
        "OpenSSH scp": lambda: scp_put(device),
    }
    log(f"push: {ROUNDS} interleaved rounds of {', '.join(variants)}")
    times: dict[str, list[float]] = {k: [] for k in variants}
    push_detail: Any = None
    toolkit_remove(device)
    for name, fn in variants.items():  # warm caches (page cache, sshd's first fork) once
        fn()
    for _ in range(ROUNDS):
        for name, fn in variants.items():
            toolkit_remove(device)
            if name == first_push:
                forget_helper(device)
            begin = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - begin)
            if name.startswith("edgetk"):
                push_detail = result
    medians = {k: statistics.median(v) for k, v in times.items()}
    helper_calls.clear()
    toolkit_remove(device)
    toolkit_push(device, client=False)
    calls_per_push = list(helper_calls)
    round_trip = helper_round_trip(device)
    begin = time.perf_counter()
    hashlib.sha256(artifact.read_bytes()).hexdigest()
    hash_s = time.perf_counter() - begin
    rates = {k: artifact_bytes / 1e6 / v for k, v in medians.items()}
    best_raw = max(rates["paramiko SFTP put (raw)"], rates["OpenSSH scp"])
    rows = [[k, f"{medians[k]:.2f} s", f"{rates[k]:.0f} MB/s", f"{rates[k] / best_raw:.2f}x"] for k in variants]
    scp_version = subprocess.run(["ssh", "-V"], check=False, capture_output=True, text=True).stderr.strip()
    parts += [f"### One device, {artifact_bytes / 1e6:.1f} MB artifact", "",
              table(["how", "median wall time", "throughput (artifact MB / s)", "vs the faster raw path"], rows), "",
              (f"{ROUNDS} interleaved rounds after one warm-up round; every variant opens its own connection and "
              f"authenticates (that is in the time). The toolkit's push also sends the rest of the bundle "
              f"({(total_bytes - artifact_bytes) / 1e3:.0f} kB: manifest, runner, golden data), takes the device "
              f"lock, checks every file's sha256 on the device and switches `current` atomically. "
              f"OpenSSH: {scp_version}."), ""]
    if push_detail is not None:
        parts += [(f"Last toolkit push: {push_detail.files_sent} files, {push_detail.bytes_sent / 1e6:.1f} MB sent, "
                  f"{push_detail.seconds:.2f} s inside `push`."), ""]

    specs = {spec(d).name: d for d in devices}

    def fleet(parallel: int) -> float:
        for d in devices:
            toolkit_remove(d)
        begin = time.perf_counter()
        result = run_fleet([spec(d) for d in devices], lambda s: toolkit_push(specs[s.name]), parallel=parallel)
        elapsed = time.perf_counter() - begin
        if result.failed:
            raise RuntimeError(f"fleet push failed on {[(o.device, o.error) for o in result.failed]}")
        return elapsed

    log(f"fleet: {DEVICES} devices, parallel vs one after another, {FLEET_ROUNDS} rounds")
    serial: list[float] = []
    parallel: list[float] = []
    for _ in range(FLEET_ROUNDS):
        serial.append(fleet(1))
        parallel.append(fleet(DEVICES))
    s_med, p_med = statistics.median(serial), statistics.median(parallel)
    parts += [f"### {DEVICES} devices", "",
              table(["how", "median wall time", "aggregate throughput", "vs one after another"], [
                  ["one after another (`--parallel 1`)", f"{s_med:.2f} s",
                   f"{DEVICES * total_bytes / 1e6 / s_med:.0f} MB/s", "1.00x"],
                  [f"in parallel (`--parallel {DEVICES}`)", f"{p_med:.2f} s",
                   f"{DEVICES * total_bytes / 1e6 / p_med:.0f} MB/s", f"{p_med / s_med:.2f}x"],
              ]), "",
              (f"{FLEET_ROUNDS} rounds, interleaved. All {DEVICES} sshd servers, the client and the sha256 checks "
              f"share this machine's {os.cpu_count()} cores (encryption is CPU-bound), so parallelism is capped by "
              f"the cores here, not by the toolkit; real devices each bring their own CPU and link."), ""]
    headline = {
        "push_mb_s": rates["edgetk push (toolkit)"],
        "best_mb_s": best_raw,
        "push_vs_best": rates["edgetk push (toolkit)"] / best_raw,
        "serial_s": s_med,
        "parallel_s": p_med,
        "fleet_ratio": p_med / s_med,
    }
    verdict = "met" if headline["push_vs_best"] >= 0.8 else "NOT met"
    transfer = rates["toolkit transfer only (`SshConnection.put`)"] / best_raw
    headline["transfer_vs_best"] = transfer
    overhead = medians[PARAMIKO_SFTP] - medians["toolkit transfer only (`SshConnection.put`)"]
    headline["helper_calls"] = len(calls_per_push)
    headline["first_push_extra_s"] = medians[first_push] - medians["edgetk push (toolkit)"]
    parts.append(f"Target: push throughput at least 0.8x the faster raw path: **{headline['push_vs_best']:.2f}x**, "
                 f"{verdict}. A bundle this large ({total_bytes / 2**20:.0f} MiB, at least "
                 f"{ssh_client.SSH_CLIENT_MIN_BYTES >> 20} MiB) is streamed through the system ssh client as one "
                 f"device-side run (toolkit/devices/ssh_client.py; the push speed subsection below); the rest of this "
                 f"paragraph is about the push over paramiko's SFTP, the route of smaller bundles (its row: "
                 f"{rates[PARAMIKO_SFTP] / best_raw:.2f}x). The SFTP transfer alone runs at {transfer:.2f}x; the rest "
                 f"of such a push (about "
                 f"{overhead:.2f} s here) is a fixed cost per push that a raw copy does not pay, so its share shrinks "
                 f"as bundles grow. One push runs the device-side helper {len(calls_per_push)} times "
                 f"({', '.join(calls_per_push)}), each a fresh `python3 -S` on the device running the helper's compiled "
                 f"copy cached there: {round_trip * 1000:.0f} ms "
                 f"per call here (median of 5), so about {len(calls_per_push) * round_trip:.2f} s of every push. "
                 f"`begin` refuses a foreign arch, probes, takes the lock and prepares the version directory; "
                 f"`finish` verifies, switches `current`, keeps 3 versions and releases the lock. The on-device "
                 f"sha256 of every uploaded file (hashlib: {hash_s:.2f} s for the artifact on this CPU) is computed "
                 f"while the upload runs, by a child that `begin` forks, and `finish` checks each file's stat is "
                 f"unchanged since; the host hashes the bundle once per process (reading it verifies the artifacts "
                 f"and the push reuses those digests). Before this change a push ran the helper 5 times (info, lock, "
                 f"prepare, finish, unlock) and hashed the artifact after the upload, on the host and on the device "
                 f"alike, and sent 32 KiB SFTP write requests (now 64 KiB, which also speeds up the transfer-only row): "
                 f"0.63x-0.75x of the faster raw path. The first push to a device also installs the helper "
                 f"(one upload and a rename, once per device and helper version): "
                 f"{headline['first_push_extra_s']:+.2f} s on that push here.")
    return "\n".join(parts), headline
