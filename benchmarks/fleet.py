"""Section ``fleet`` (issue 15): one controller, a staged rollout to 8 vs 50 vs 200 devices.

``edgetk deploy BUNDLE --inventory devices.toml --check --waves 1,10%,100% --max-failures 5% --parallel 8``
run as a user runs it (a subprocess), against real loopback sshd devices: sshd processes, each listening
on many ports, one Unix user (own home) per device, so every device is a separate login and a separate
install. Measured per fleet size: wall time, the controller's peak RSS (``ru_maxrss`` of the edgetk process)
and its peak number of open sockets (sampled from /proc/PID/fd every 20 ms): with bounded concurrency both
must stay flat as the fleet grows, and the time grow linearly. Needs root (users, sshd).
"""

from __future__ import annotations

import json
import os
import pwd
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, log, table

TITLE = "Fleet: a staged rollout from one controller to 8-200 devices (issue 15)"
SIZES = tuple(int(n) for n in os.environ.get("EDGETK_BENCH_FLEET_SIZES", "8,50,200").split(","))
PORTS_PER_SERVER = 16  # OpenSSH listens on at most 16 sockets per sshd (MAX_LISTEN_SOCKS)
PARALLEL = 8


def _sockets(pid: int) -> int:
    try:
        return sum(1 for fd in os.listdir(f"/proc/{pid}/fd")
                   if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"))
    except OSError:
        return 0


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, float, float, int, str]:
    """(exit code, seconds, peak RSS MB, peak sockets, stdout) of one edgetk run in a fresh wrapper process
    (so ru_maxrss of its children is this run's alone)."""
    wrapper = ("import resource, subprocess, sys, json, time\n"
               "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)\n"
               "print(p.pid, flush=True)\n"
               "out = p.communicate()[0]\n"
               "print(json.dumps([p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, out]))\n")
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", wrapper, *argv], stdout=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _sockets(child))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rest = proc.stdout.read()
    proc.wait()
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    code, maxrss_kb, out = json.loads(rest.strip().splitlines()[-1])
    return code, seconds, maxrss_kb / 1024.0, peak[0], out


def run() -> tuple[str, dict[str, Any]]:
    from tests.fixtures.deploy import build_bundle
    from tests.fixtures.device_envs import DEVICE_REQUIREMENTS, ensure_env
    from tests.fixtures.sshd import SSHD, _free_port, _keygen

    parts = [f"## {TITLE}", ""]
    if os.geteuid() != 0 or not SSHD.exists():
        parts.append("Not measured: needs root and /usr/sbin/sshd (scripts/test installs it).")
        return "\n".join(parts), {}
    subprocess.run(["install", "-d", "-m755", "/run/sshd"], check=True)
    python = str(ensure_env("device", DEVICE_REQUIREMENTS).python)
    root = Path(tempfile.mkdtemp(prefix="edgetk-bench-fleet-"))
    root.chmod(0o755)
    tag = uuid.uuid4().hex[:4]
    users: list[str] = []
    servers: list[subprocess.Popen[bytes]] = []
    try:
        key = root / "client_key"
        _keygen(key)
        authorized = root / "authorized_keys"
        shutil.copyfile(key.with_name("client_key.pub"), authorized)
        authorized.chmod(0o644)
        total = max(SIZES)
        devices = []
        for i in range(total):
            user = f"etkf{tag}{i}"
            home = root / "homes" / user
            home.mkdir(parents=True)
            subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", user], check=True, capture_output=True)
            subprocess.run(["usermod", "-p", "*", user], check=True, capture_output=True)
            users.append(user)
            info = pwd.getpwnam(user)
            os.chown(home, info.pw_uid, info.pw_gid)
            devices.append({"user": user, "port": _free_port()})
        known = []
        servers_needed = -(-total // PORTS_PER_SERVER)
        for s in range(servers_needed):
            mine = devices[s * PORTS_PER_SERVER:(s + 1) * PORTS_PER_SERVER]
            host_key = root / f"host_key_{s}"
            _keygen(host_key)
            config = root / f"sshd_{s}.conf"
            config.write_text("\n".join(
                [f"Port {d['port']}" for d in mine] + [
                    "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"AuthorizedKeysFile {authorized}",
                    f"PidFile {root / f'sshd_{s}.pid'}", "UsePAM no", "StrictModes no", "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no", "Subsystem sftp internal-sftp", "MaxStartups 200:30:400",
                    "MaxSessions 100", "LogLevel ERROR"]) + "\n")
            servers.append(subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            kind, blob = host_key.with_name(host_key.name + ".pub").read_text().split()[:2]
            known += [f"[127.0.0.1]:{d['port']} {kind} {blob}\n" for d in mine]
        (root / "known_hosts").write_text("".join(known))
        import socket

        deadline = time.monotonic() + 30
        for d in devices:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", d["port"]), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sshd does not listen on {d['port']}") from None
                    time.sleep(0.05)
        bundle = build_bundle(root / "bundle", name="fleet", seed=0)
        rows, figures = [], {}
        for size in SIZES:
            inventory = root / f"fleet{size}.toml"
            inventory.write_text("".join(
                f'[devices.d{i:03d}]\nhost = "127.0.0.1"\nport = {d["port"]}\nuser = "{d["user"]}"\n'
                f'identity_file = "{key}"\nknown_hosts = "{root / "known_hosts"}"\npython = "{python}"\n\n'
                for i, d in enumerate(devices[:size])))
            env = dict(os.environ, HOME=str(root), EDGETK_STORE=str(root / f"history{size}.sqlite"))
            argv = [sys.executable, "-m", "toolkit.cli", "deploy", str(bundle), "--inventory", str(inventory),
                    "--check", "--runs", "5", "--warmup", "1", "--baseline", "none", "--budget-ms", "100000",
                    "--waves", "1,10%,100%", "--max-failures", "5%", "--parallel", str(PARALLEL), "--json"]
            log(f"fleet: {size} devices")
            code, seconds, rss, sockets, out = _run(argv, env)
            doc = json.loads(out)
            ok = sum(1 for d in doc["devices"] if d["ok"])
            for failed in [d for d in doc["devices"] if not d["ok"]][:3]:
                log(f"fleet: {failed['device']} failed: {failed['error']}")
            waves = [len(w["devices"]) for w in doc["rollout"]["waves"]]
            figures[size] = {"seconds": seconds, "rss_mb": rss, "sockets": sockets, "ok": ok, "code": code}
            rows.append([size, "+".join(map(str, waves)), f"{ok}/{size}", f"{seconds:.1f}",
                         f"{seconds / size:.2f}", f"{rss:.0f}", sockets])
        base = figures[SIZES[0]]
        parts += [
            f"`edgetk deploy --check --waves 1,10%,100% --max-failures 5% --parallel {PARALLEL}` of a one-artifact "
            f"ONNX bundle (deploy + a 5-run check per device) to N loopback devices ({servers_needed} sshd processes of "
            f"up to {PORTS_PER_SERVER} ports each, one Unix user and home per device):",
            "",
            table(["devices", "waves", "ok", "wall s", "s per device", "peak RSS MB", "peak sockets"], rows),
            "",
            f"{SIZES[-1]} vs {SIZES[0]} devices: wall time {figures[SIZES[-1]]['seconds'] / base['seconds']:.1f}x for {SIZES[-1] / SIZES[0]:.0f}x the devices, "
            f"peak RSS {figures[SIZES[-1]]['rss_mb'] / base['rss_mb']:.2f}x, peak open sockets {figures[SIZES[-1]]['sockets']} "
            f"vs {base['sockets']} (at most --parallel connections at once, each closed after its device).",
        ]
        return "\n".join(parts), {"fleet": {str(k): v for k, v in figures.items()}}
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)
        for user in users:
            subprocess.run(["userdel", "-f", user], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
