"""Part of section ``deploy`` (issue 24): push speed against the plain copies a user would compare it with, on an
OpenSSH device (SFTP) and on an embedded stand-in (Dropbear 2022.83, no sftp-server, busybox: pushes go as one
framed stream on an exec channel), with 2 MB and 50 MB bundles.

Per device and size, timed interleaved, each opening its own connection: ``edgetk push`` (all files missing:
the version is removed before each round), ``ssh host 'cat > f' < f``, ``scp -O`` (the old SCP protocol, over an
exec channel) and ``scp`` (SFTP; impossible on the Dropbear device). On the OpenSSH device the push is also
timed with SFTP turned off (the stream Dropbear devices get). The raw copies move the artifact only; the push
moves the whole bundle (the artifact plus about 100 kB: manifest, runner, golden data), takes the lock, hashes
on the device and switches ``current``.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
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

from benchmarks.common import log, table, work_dir

SIZES_MB = (2, 50)
ROUNDS = {2: 7, 50: 5}  # small pushes are quick and noisier on a shared machine: more rounds
PUSH = "edgetk push"
PARAMIKO = "edgetk push, paramiko only (as before: SFTP on OpenSSH, one exec stream on Dropbear)"
CLIENT = "edgetk push, the stream through the ssh client at any size"
STREAM = "edgetk push, SFTP off (one exec stream, paramiko)"
NO_CHACHA = "edgetk push without ChaCha20 (as before: AES-CTR + HMAC-SHA2-256)"
CAT = "ssh host 'cat > f' < f"
SCP_O = "scp -O"
SCP = "scp (SFTP)"


def _bundle(size_mb: int) -> Path:
    from tests.fixtures.bundles import make_big_onnx, write_bundle

    path = work_dir() / "deploy" / f"transport-{size_mb}mb"
    if not (path / "manifest.json").is_file():
        shutil.rmtree(path, ignore_errors=True)
        x = np.random.default_rng(1).standard_normal((4, 1, 16), dtype=np.float32)
        write_bundle(path, files=[("model.fp32.onnx", make_big_onnx(size_mb, seed=size_mb))], golden_inputs=[x],
                     name=f"transport-{size_mb}mb")
    return path


def _cpu(who: int) -> float:
    """CPU seconds (user + system) of this process (``RUSAGE_SELF``: the push, all its threads) or of the commands
    it ran and waited for (``RUSAGE_CHILDREN``: ssh, scp)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _server_cpu(device: Any) -> float | None:
    """CPU seconds of the device's finished sessions: its SSH server's reaped children (each connection's server
    process, the login shell and what it ran: cat, scp, the helper's python3); None if the server is not ours."""
    pid = getattr(getattr(device, "process", None), "pid", None)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime + cstime


def _settled_server_cpu(device: Any) -> float | None:
    """``_server_cpu`` once the sessions that just ended are reaped (it stays the same for 0.2 s; 3 s at most)."""
    last = _server_cpu(device)
    for _ in range(30):
        time.sleep(0.1)
        now = _server_cpu(device)
        if now == last:
            time.sleep(0.1)
            if _server_cpu(device) == now:
                return now
        last = now
    return last


def _variants(device: Any, key: Path, known_hosts: Path, bundle_dir: Path, *, sftp: bool) -> dict[str, Callable[[], Any]]:
    import paramiko

    from toolkit.delivery import deployment
    from toolkit.delivery.push import push as push_bundle
    from toolkit.delivery.bundle import read_bundle
    from toolkit.devices import ssh_client, ssh_link
    from toolkit.devices import open_connection
    from toolkit.devices.spec import DeviceSpec

    bundle = read_bundle(bundle_dir)
    artifact = bundle_dir / "model.fp32.onnx"
    spec = DeviceSpec(name=device.name, host="127.0.0.1", port=device.port, user=device.user,
                      identity_file=str(key), known_hosts=str(known_hosts))
    ssh_opts = ["-i", str(key), "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"]

    def push(*, stream: bool, chacha: bool = True, client: bool | None = None) -> Any:
        conn = open_connection(spec)
        try:
            device_ = deployment.Device(spec, conn)
            try:
                deployment.remove(device_, bundle.name)  # every file missing again
            except Exception:  # noqa: BLE001, S110 - nothing installed yet
                pass
        finally:
            conn.close()
        # without ChaCha20: paramiko's own transport and ciphers, as before issue 24
        # client: None the route the threshold picks (ssh_client.SSH_CLIENT_MIN_BYTES), True/False forced
        with contextlib.nullcontext() if chacha else mock.patch.object(ssh_link, "ChachaTransport",
                                                                       paramiko.Transport), \
                contextlib.nullcontext() if client is None else mock.patch.object(
                    ssh_client, "SSH_CLIENT_MIN_BYTES", 0 if client else 1 << 62):
            conn = open_connection(spec)
            if stream:
                conn._sftp_broken = "turned off for the benchmark"  # type: ignore[attr-defined]
            try:
                begin, cpu = time.perf_counter(), _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN)
                push_bundle(deployment.Device(spec, conn), bundle, progress_stream=io.StringIO())
                return time.perf_counter() - begin, _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN) - cpu
            finally:
                conn.close()

    def timed(argv: list[str], **kwargs: Any) -> tuple[float, float]:
        begin, cpu = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, check=True, capture_output=True, **kwargs)
        return time.perf_counter() - begin, _cpu(resource.RUSAGE_CHILDREN) - cpu

    def cat() -> tuple[float, float]:
        with open(artifact, "rb") as handle:
            return timed(["ssh", "-p", str(device.port), *ssh_opts, f"{device.user}@127.0.0.1", "cat > raw_cat.bin"],
                         stdin=handle)

    def scp(legacy: bool) -> tuple[float, float]:
        return timed(["scp", *(["-O"] if legacy else []), "-q", "-P", str(device.port), *ssh_opts, str(artifact),
                      f"{device.user}@127.0.0.1:raw_scp.bin"])

    variants: dict[str, Callable[[], Any]] = {PUSH: lambda: push(stream=False)}
    if sum(f.bytes for f in bundle.files()) >= ssh_client.SSH_CLIENT_MIN_BYTES:  # the other route, side by side
        variants[PARAMIKO] = lambda: push(stream=False, client=False)
    else:
        variants[CLIENT] = lambda: push(stream=False, client=True)
    if sftp:
        variants[STREAM] = lambda: push(stream=True, client=False)
    if not sftp:  # the OpenSSH device has AES-GCM, which the push prefers either way
        variants[NO_CHACHA] = lambda: push(stream=False, chacha=False, client=False)
    variants[CAT] = cat
    variants[SCP_O] = lambda: scp(True)
    if sftp:
        variants[SCP] = lambda: scp(False)
    return variants


def measure(openssh: Any, openssh_key: Path, openssh_known: Path) -> tuple[list[str], dict[str, Any]]:
    """The subsection's markdown lines and headline figures (Dropbear skipped, and said so, without the packages)."""
    from tests.fixtures.device_envs import DEVICE_REQUIREMENTS, ensure_env
    from tests.fixtures.dropbear import BUSYBOX, DROPBEAR, _Farm
    from tests.fixtures.sshd import _keygen

    parts = ["### Push speed vs plain copies, OpenSSH and Dropbear devices (issue 24)", ""]
    devices: list[tuple[str, Any, Path, Path, bool]] = [("OpenSSH (SFTP)", openssh, openssh_key, openssh_known, True)]
    farm = None
    if DROPBEAR.exists() and BUSYBOX.exists():
        root = Path(tempfile.mkdtemp(prefix="edgetk-bench-dropbear-"))
        root.chmod(0o755)
        key = root / "client_key"
        _keygen(key)
        farm = _Farm(root, key, ensure_env("device", DEVICE_REQUIREMENTS))
        dropbear = farm.make("dropbear", home_mb=400)
        known = root / "known_hosts"
        known.write_text(dropbear.known_hosts_line())
        devices.append(("Dropbear 2022.83, no SFTP, busybox", dropbear, key, known, False))
    else:
        parts += ["Dropbear not measured: dropbear-bin and busybox-static are not installed.", ""]
    headline: dict[str, Any] = {}
    rows = []
    try:
        for size in SIZES_MB:
            bundle_dir = _bundle(size)
            artifact_mb = (bundle_dir / "model.fp32.onnx").stat().st_size / 1e6
            for label, device, key, known, sftp in devices:
                variants = _variants(device, key, known, bundle_dir, sftp=sftp)
                log(f"transport: {label}, {size} MB, {ROUNDS[size]} interleaved rounds of {', '.join(variants)}")
                times: dict[str, list[float]] = {k: [] for k in variants}
                host_cpu: dict[str, list[float]] = {k: [] for k in variants}
                device_cpu: dict[str, list[float]] = {k: [] for k in variants}
                for fn in variants.values():  # warm-up: page cache, the helper installed, the SFTP fact known
                    fn()
                for _ in range(ROUNDS[size]):
                    for name, fn in variants.items():
                        before = _settled_server_cpu(device)  # the last row's sessions reaped and counted
                        seconds, cpu = fn()
                        after = _settled_server_cpu(device)
                        times[name].append(seconds)
                        host_cpu[name].append(cpu)
                        if before is not None and after is not None:
                            device_cpu[name].append(after - before)
                medians = {k: statistics.median(v) for k, v in times.items()}
                reference = CAT if not sftp else SCP
                for name, value in medians.items():
                    rows.append([label, f"{artifact_mb:.0f} MB", name, f"{value:.2f} s",
                                 f"{artifact_mb / value:.0f} MB/s", f"{medians[CAT] / value:.2f}x",
                                 f"{medians[SCP_O] / value:.2f}x",
                                 f"{medians[SCP] / value:.2f}x" if SCP in medians else "n/a",
                                 f"{statistics.median(host_cpu[name]):.2f} s",
                                 f"{statistics.median(device_cpu[name]):.2f} s" if device_cpu[name] else "n/a"])
                kind = "openssh" if sftp else "dropbear"
                headline[f"{kind}_{size}mb_push_vs_{'scp' if sftp else 'ssh_cat'}"] = medians[reference] / medians[PUSH]
                headline[f"{kind}_{size}mb_push_vs_scp_O"] = medians[SCP_O] / medians[PUSH]
                if sftp:
                    headline[f"{kind}_{size}mb_stream_vs_ssh_cat"] = medians[CAT] / medians[STREAM]
    finally:
        if farm is not None:
            farm.close()
    parts += [table(["device", "artifact", "how", "median wall time", "MB/s", "speed vs ssh cat",
                     "vs scp -O", "vs scp (SFTP)", "host CPU", "device CPU"], rows), "",
              _note(), ""]
    return parts, headline


def _note() -> str:
    """The paragraph under the table: how it was measured and what the push does."""
    return (
        f"{' and '.join(f'{n} ({m} MB)' for m, n in ROUNDS.items())} interleaved rounds after one warm-up "
        "round; every row opens its own connection and "
        "authenticates (that is in the time). A ratio above 1 means the push is faster. Targets: a push over "
        "exec (Dropbear) at least 0.8x `ssh cat`, a push over SFTP (OpenSSH) at least 0.8x `scp`. The push "
        "also sends the rest of the bundle (about 100 kB), takes the device lock, checks every file's "
        "sha256 on the device and switches `current`: at 2 MB that fixed cost is most of the time. Without "
        "SFTP (the Dropbear device, and the OpenSSH one with SFTP off) the whole push is one device-side "
        "Python run on one channel (`push`: begin's plan answered on stdout, the missing files streamed on "
        "the same stdin, received, hashed and finished); over SFTP it is `begin`, the upload, then `finish`. "
        "From 32 MiB (`ssh_client.SSH_CLIENT_MIN_BYTES`) that one-run stream goes through the system `ssh` client "
        "instead of paramiko, on either device (OpenSSH's compiled transport: about half the client CPU; the "
        "host key pinned to the one paramiko verified, toolkit/devices/ssh_client.py); the other route is timed "
        "beside it: `paramiko only` over the threshold (as before this route), `through the ssh client at any "
        "size` under it (its extra connection and login cost more than they save there). "
        "Ciphers: ssh and scp pick chacha20-poly1305 (OpenSSH's first choice), the push AES-GCM where the "
        "server has it (the OpenSSH device) and chacha20-poly1305 on Dropbear (the toolkit's own, for "
        "paramiko: toolkit/devices/ssh_chacha.py). Dropbear's receive window (24 KiB, its default) makes "
        "every copy to that device a stop-and-wait of one 24 KiB packet at a time, so the time of each round "
        "trip through the client decides the speed. The push sends whole 24 KiB packets (paramiko's "
        "`sendall` split a third of them into 8-16 KiB ones, each a round trip), seals the next packet while "
        "it waits, and sends it from paramiko's transport thread the moment the window adjustment is read "
        "(toolkit/devices/ssh_window.py; before these, 0.69x at 50 MB); the helper widens its stdin pipe to "
        "1 MiB so Dropbear never waits on it while it hashes. `host CPU` is the CPU time of the sending "
        "process (all its threads, and its ssh client where the push used one; for ssh and scp the client process), `device CPU` that of the device's SSH server "
        "sessions and what they ran (sshd or dropbear, cat, scp, the helper's python3; not the detached "
        "child that hashes an SFTP push's files), medians per row. "
        "Client and device share this machine's 2 cores.")
