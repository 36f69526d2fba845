"""The user's ~/.ssh/config as OpenSSH reads it, against real sshd servers, side by side with OpenSSH's own
``ssh -F`` on the same file (it must reach the same place, or edgetk says why it does not); shells that talk;
authentication messages a user can act on. Real keys, a real ssh-agent, a real login shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.fixtures.home import Home

from toolkit.devices import open_connection, parse_spec
from toolkit.errors import AuthRefused, UsageError

pytestmark = pytest.mark.ssh

PROXY = """import socket, sys, threading
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while True:
        data = sys.stdin.buffer.read1(65536)
        if not data:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(data)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


def _ssh(config: Path, host: str, *command: str) -> subprocess.CompletedProcess[str]:
    """OpenSSH itself, non-interactive, on the same configuration."""
    return subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", host, *command], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def home(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    (tmp_path / ".ssh").mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return tmp_path


def _whoami(host: str) -> str:
    with open_connection(parse_spec(host)) as conn:
        return conn.run(["id", "-un"], timeout=30).stdout.strip()


def test_include_glob_under_dot_ssh(home, ssh_devices, ssh_client_key):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    known = home / "kh"
    known.write_text(dev.known_hosts_line())
    (home / ".ssh" / "config.d").mkdir()
    (home / ".ssh" / "config.d" / "pi.conf").write_text(
        f"Host pi-inc\n  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n  IdentityFile {ssh_client_key}\n"
        f"  UserKnownHostsFile {known}\n")
    (home / ".ssh" / "config").write_text("Include config.d/*.conf\n")
    assert _whoami("pi-inc") == dev.user
    # OpenSSH, on the same files (its ~ is the passwd home, so the Include is given absolute here)
    side = home / "ssh_config"
    side.write_text(f"Include {home}/.ssh/config.d/*.conf\n")
    assert _ssh(side, "pi-inc", "id", "-un").stdout.strip() == dev.user


def test_proxycommand_is_the_path_taken(home, ssh_devices, ssh_client_key):  # type: ignore[no-untyped-def]
    """HostName:Port is closed; only the ProxyCommand reaches the device (the tool used to go straight)."""
    (dev,) = ssh_devices(1)
    proxy = home / "proxy.py"
    proxy.write_text(PROXY)
    known = home / "kh"
    known.write_text(dev.known_hosts_line().replace(f"[127.0.0.1]:{dev.port}", "via-proxy"))
    config = home / ".ssh" / "config"
    config.write_text(
        f"Host via-proxy\n  HostName 127.0.0.1\n  Port 1\n  User {dev.user}\n  IdentityFile {ssh_client_key}\n"
        f"  HostKeyAlias via-proxy\n  UserKnownHostsFile {known}\n"
        f"  ProxyCommand {sys.executable} {proxy} 127.0.0.1 {dev.port}\n")
    assert _whoami("via-proxy") == dev.user
    assert _ssh(config, "via-proxy", "id", "-un").stdout.strip() == dev.user


def test_identity_agent_and_identities_only(home, ssh_devices, ssh_client_key, tmp_path):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    known = home / "kh"
    known.write_text(dev.known_hosts_line())
    other = home / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    sock = tmp_path / "agent.sock"
    agent = subprocess.run(["ssh-agent", "-a", str(sock)], capture_output=True, text=True, check=True)
    pid = int(agent.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        subprocess.run(["ssh-add", str(ssh_client_key)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                       check=True, capture_output=True)
        base = (f"  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n  UserKnownHostsFile {known}\n"
                f"  IdentityAgent {sock}\n")
        config = home / ".ssh" / "config"
        config.write_text(f"Host by-agent\n{base}\nHost only-other\n{base}  IdentityFile {other}\n"
                          "  IdentitiesOnly yes\n")
        assert _whoami("by-agent") == dev.user  # the key is only in that agent
        assert _ssh(config, "by-agent", "id", "-un").stdout.strip() == dev.user
        with pytest.raises(AuthRefused) as refused:  # IdentitiesOnly: the agent's key is not offered
            _whoami("only-other")
        assert "refused every key tried" in refused.value.message and "other_key" in refused.value.message
        assert "ssh-copy-id" in (refused.value.hint or "")
        assert _ssh(config, "only-other", "true").returncode == 255  # OpenSSH refuses it too
    finally:
        os.kill(pid, 15)


def test_certificate_file(home, fresh_ssh_device, tmp_path):  # type: ignore[no-untyped-def]
    dev = fresh_ssh_device()
    ca = tmp_path / "ca"
    user_key = home / "cert_user"
    for path in (ca, user_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "edgetk-test", "-n", dev.user,
                    str(user_key.with_suffix(".pub"))], check=True)
    cert = home / "somewhere-cert.pub"
    (home / "cert_user-cert.pub").rename(cert)
    dev.authorized_keys.write_text("")  # no plain key: only the CA opens the door
    original = dev._write_config

    def with_ca() -> Path:
        config = original()
        config.write_text(config.read_text() + f"TrustedUserCAKeys {ca}.pub\n")
        return config

    dev._write_config = with_ca  # type: ignore[method-assign]
    dev.stop()
    dev.start()
    known = home / "kh"
    known.write_text(dev.known_hosts_line())
    config = home / ".ssh" / "config"
    config.write_text(f"Host certified\n  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n"
                      f"  IdentityFile {user_key}\n  CertificateFile {cert}\n  UserKnownHostsFile {known}\n")
    assert _whoami("certified") == dev.user
    assert _ssh(config, "certified", "id", "-un").stdout.strip() == dev.user


def test_an_option_that_changes_the_connection_is_refused_by_name(home, ssh_devices, ssh_client_key):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    (home / ".ssh" / "config").write_text(
        f"Host odd\n  HostName 127.0.0.1\n  Port {dev.port}\n  RemoteCommand echo hi\n  BindAddress 127.0.0.2\n")
    with pytest.raises(UsageError) as refused:
        _whoami("odd")
    assert "bindaddress, remotecommand" in refused.value.message and "odd" in refused.value.message


def test_password_only_device_says_what_it_offers(home, fresh_ssh_device, ssh_client_key):  # type: ignore[no-untyped-def]
    dev = fresh_ssh_device()
    original = dev._write_config

    def password_only() -> Path:
        config = original()
        config.write_text(config.read_text().replace("PasswordAuthentication no", "PasswordAuthentication yes")
                          + "PubkeyAuthentication no\n")
        return config

    dev._write_config = password_only  # type: ignore[method-assign]
    dev.stop()
    dev.start()
    known = home / "kh"
    known.write_text(dev.known_hosts_line())
    (home / ".ssh" / "config").write_text(
        f"Host pw\n  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n  IdentityFile {ssh_client_key}\n"
        f"  UserKnownHostsFile {known}\n")
    with pytest.raises(AuthRefused) as refused:
        _whoami("pw")
    assert "does not accept keys" in refused.value.message and "password" in refused.value.message
    assert f"ssh-copy-id -p {dev.port} -i" in (refused.value.hint or "")


def test_a_talking_login_shell_is_survived_and_named(home, fresh_ssh_device, ssh_client_key, caplog):  # type: ignore[no-untyped-def]
    """bash sources ~/.bashrc for ssh commands; an echo there prefixes every command's stdout and breaks the
    SFTP stream (an external sftp-server starts through the login shell)."""
    dev = fresh_ssh_device()
    original = dev._write_config

    def external_sftp() -> Path:
        config = original()
        config.write_text(config.read_text().replace("internal-sftp", "/usr/lib/openssh/sftp-server"))
        return config

    dev._write_config = external_sftp  # type: ignore[method-assign]
    dev.stop()
    dev.start()
    subprocess.run(["usermod", "-s", "/bin/bash", dev.user], check=True)
    (dev.home / ".bashrc").write_text('echo "Welcome to the Pi, $USER"\n')
    known = home / "kh"
    known.write_text(dev.known_hosts_line())
    (home / ".ssh" / "config").write_text(
        f"Host chatty\n  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n  IdentityFile {ssh_client_key}\n"
        f"  UserKnownHostsFile {known}\n")
    assert "Welcome" in _ssh(home / ".ssh" / "config", "chatty", "true").stdout  # the shell really talks
    src = home / "blob.bin"
    src.write_bytes(os.urandom(300_000))
    with open_connection(parse_spec("chatty")) as conn:
        assert conn.run(["id", "-un"], timeout=30).stdout.strip() == dev.user
        conn.put(src, "blob.bin")
        assert (dev.home / "blob.bin").read_bytes() == src.read_bytes()
        assert conn.exists("blob.bin") and not conn.exists("nope")
        conn.get("blob.bin", home / "back.bin")
        back = (home / "back.bin").read_bytes()
        assert len(back) == len(src.read_bytes()) and back == src.read_bytes(), (len(back), back[-40:], src.read_bytes()[-40:])
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "prints text on start-up" in warned and dev.user in warned and '[ -z "$PS1" ] && return' in warned


def _ssh_g(config: Path, host: str) -> dict[str, str]:
    out = subprocess.run(["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, check=True,
                         stdin=subprocess.DEVNULL).stdout
    values: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        values.setdefault(key.lower(), value)
    return values


def test_resolution_matches_ssh_dash_g(home):  # type: ignore[no-untyped-def]
    """Every option edgetk follows, resolved by edgetk and by OpenSSH's own `ssh -G` from one file: the same."""
    from toolkit.devices.ssh_config import resolve

    for name in ("k", "k-cert.pub", "other"):
        (home / name).write_text("x")
    (home / ".ssh" / "extra.conf").write_text("Host pi-*\n  ServerAliveCountMax 2\n")
    config = home / ".ssh" / "config"
    config.write_text(
        f"Host pi-*\n  User pi\n  ConnectTimeout 7\n  Include {home}/.ssh/extra.conf\n  ServerAliveInterval 9\n"
        f"Host pi-a\n  HostName 10.0.0.5\n  Port 2201\n  IdentityFile {home}/k\n  IdentitiesOnly yes\n"
        f"  CertificateFile {home}/k-cert.pub\n  IdentityAgent {home}/agent.sock\n"
        f"  ProxyCommand {sys.executable} proxy.py %h %p\n  HostKeyAlias pia\n"
        f"  UserKnownHostsFile {home}/kh1 {home}/kh2\n  GlobalKnownHostsFile {home}/gkh\n  HashKnownHosts yes\n"
        "  StrictHostKeyChecking accept-new\n"
        f"Host pi-b\n  HostName 10.0.0.6\n  IdentityFile {home}/other\n  ProxyJump jump@10.0.0.1:2222\n")
    ours = resolve("pi-a", home=home, system_config=None)
    theirs = _ssh_g(config, "pi-a")
    assert (ours.hostname, str(ours.port), ours.user) == (theirs["hostname"], theirs["port"], theirs["user"])
    assert list(ours.identity_files) == [theirs["identityfile"]]
    assert ours.identities_only is (theirs["identitiesonly"] == "yes")
    assert list(ours.certificate_files) == [theirs["certificatefile"]]
    assert ours.identity_agent == theirs["identityagent"]
    assert ours.proxy_command == theirs["proxycommand"].replace("%h", "10.0.0.5").replace("%p", "2201")
    assert ours.host_key_alias == theirs["hostkeyalias"] and ours.host_key_name == "pia"
    assert [str(p) for p in ours.user_known_hosts] == theirs["userknownhostsfile"].split()
    assert [str(p) for p in ours.global_known_hosts] == theirs["globalknownhostsfile"].split()
    assert ours.hash_known_hosts is (theirs["hashknownhosts"] == "yes")
    assert ours.strict_host_key_checking == theirs["stricthostkeychecking"]
    assert ours.connect_timeout == float(theirs["connecttimeout"])
    assert (ours.server_alive_interval, ours.server_alive_count_max) == (
        float(theirs["serveraliveinterval"]), int(theirs["serveralivecountmax"]))
    other = resolve("pi-b", home=home, system_config=None)
    theirs_b = _ssh_g(config, "pi-b")
    assert other.proxy_jump == theirs_b["proxyjump"].replace("[", "").replace("]", "") and other.port == int(theirs_b["port"]) == 22
    assert other.user == theirs_b["user"] == "pi" and not other.identities_only


def test_trusted_key_is_hashed_with_hashknownhosts_and_ssh_accepts_it(home, ssh_devices, ssh_client_key):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    known = home / "kh"
    config = home / ".ssh" / "config"
    config.write_text(f"Host hashed\n  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n"
                      f"  IdentityFile {ssh_client_key}\n  UserKnownHostsFile {known}\n  HashKnownHosts yes\n")
    with open_connection(parse_spec("hashed"), trust_new_host=True) as conn:
        assert conn.run(["true"], timeout=30).ok
    entry = known.read_text()
    assert entry.startswith("|1|") and "127.0.0.1" not in entry
    # OpenSSH finds it and connects with strict checking on
    assert _ssh(config, "hashed", "-o", "StrictHostKeyChecking=yes", "true").returncode == 0


def test_server_alive_settings_drive_the_watchdog(home, fresh_ssh_device, ssh_client_key):  # type: ignore[no-untyped-def]
    """ServerAliveInterval 1 / CountMax 2: a frozen device mid-command is given up after ~2 s, not ~12 s."""
    from tests.fixtures.frozen import frozen
    from toolkit.errors import DeviceStopped

    dev = fresh_ssh_device()
    known = home / "kh"
    known.write_text(dev.known_hosts_line())
    (home / ".ssh" / "config").write_text(
        f"Host tight\n  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n  IdentityFile {ssh_client_key}\n"
        f"  UserKnownHostsFile {known}\n  ServerAliveInterval 1\n  ServerAliveCountMax 2\n")
    assert dev.process is not None
    with open_connection(parse_spec("tight")) as conn:
        assert conn.run(["true"], timeout=30).ok
        with frozen(dev.process.pid):
            with pytest.raises(DeviceStopped) as stopped:
                conn.run(["sleep", "60"], timeout=120)  # the command's own deadline is far away
        assert "no reply to 2 keepalives in 2 s" in stopped.value.message
        with pytest.raises(DeviceStopped):  # and the connection stays failed: no silent reconnect
            conn.run(["true"], timeout=30)


def test_cli_exit_codes_for_config_and_auth_refusals(home, fresh_ssh_device, ssh_client_key, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    from tests.fixtures.cli import assert_clean_error, run_edgetk

    dev = fresh_ssh_device()
    dev.authorized_keys.write_text("")  # our key is not installed
    known = home / "kh"
    known.write_text(dev.known_hosts_line())
    (home / ".ssh" / "config").write_text(
        f"Host nokey\n  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n  IdentityFile {ssh_client_key}\n"
        f"  UserKnownHostsFile {known}\n"
        f"Host tunnel\n  HostName 127.0.0.1\n  Port {dev.port}\n  Tunnel yes\n")
    bundle = deploy_bundle_factory(name="tiny")
    env = Home(home).env
    assert_clean_error(run_edgetk("deploy", bundle, "--device", "nokey", env=env), 4, "refused every key tried",
                       "ssh-copy-id")
    assert_clean_error(run_edgetk("deploy", bundle, "--device", "tunnel", env=env), 2, "tunnel",
                       "does not follow")


def test_an_upload_the_device_stops_taking_fails_with_a_deadline(home, fresh_ssh_device, ssh_client_key,  # type: ignore[no-untyped-def]
                                                                 ssh_known_hosts, monkeypatch):
    """sshd still answers (keepalives fine) but its sftp-server is stuck, as on a hung disk: the upload's own
    deadline fires (shortened here from 60 s)."""
    import signal

    from tests.fixtures.netns import descendants
    from toolkit.devices import ssh
    from toolkit.devices.spec import DeviceSpec
    from toolkit.errors import DeviceTimeout

    monkeypatch.setattr(ssh, "UPLOAD_STALL_S", 3.0)
    dev = fresh_ssh_device()
    original = dev._write_config

    def external_sftp() -> Path:
        config = original()
        config.write_text(config.read_text().replace("internal-sftp", "/usr/lib/openssh/sftp-server"))
        return config

    dev._write_config = external_sftp  # type: ignore[method-assign]
    dev.stop()
    dev.start()
    base = parse_spec(dev.spec)
    spec = DeviceSpec(name="stuck-disk", host=base.host, port=base.port, user=base.user,
                      identity_file=str(ssh_client_key), known_hosts=str(ssh_known_hosts(dev)))
    big = home / "big.bin"
    big.write_bytes(os.urandom(8 << 20))
    assert dev.process is not None
    with open_connection(spec) as conn:
        assert not conn.exists("big.bin")  # SFTP is open
        (server,) = [p for p in descendants(dev.process.pid)
                     if Path(f"/proc/{p}/comm").read_text().strip() == "sftp-server"]
        os.kill(server, signal.SIGSTOP)
        try:
            with pytest.raises(DeviceTimeout) as stalled:
                conn.put(big, "big.bin")
        finally:
            os.kill(server, signal.SIGCONT)
        assert "took no data for 3 s" in stalled.value.message
        assert conn.run(["true"], timeout=30).ok  # the device itself still answers


def test_include_inside_a_host_block_keeps_that_block(home):  # type: ignore[no-untyped-def]
    """As ssh: an Include inside `Host a` applies there, what follows the Include is still under `Host a`, and a
    `Host b` inside the included file never matches b, because the block it was included from does not apply
    to b (OpenSSH's SSHCONF_NEVERMATCH); relative paths are under ~/.ssh."""
    from toolkit.devices.ssh_config import resolve

    (home / ".ssh" / "inc").mkdir()
    (home / ".ssh" / "inc" / "1.conf").write_text("Port 2201\nHost b\n  User bee\n")
    (home / ".ssh" / "inc" / "2.conf").write_text("User from-glob\n")
    config = home / ".ssh" / "config"
    config.write_text("Host a\n  Include inc/*.conf\n  HostName 10.1.1.1\nHost *\n  User star\n")
    a = resolve("a", home=home, system_config=None)
    assert (a.hostname, a.port, a.user) == ("10.1.1.1", 2201, "from-glob")
    b = resolve("b", home=home, system_config=None)
    assert (b.hostname, b.port, b.user) == ("b", 22, "star")
    side = home / "side.conf"  # OpenSSH on the same text, the Include made absolute
    side.write_text(config.read_text().replace("inc/*.conf", f"{home}/.ssh/inc/*.conf"))
    g = _ssh_g(side, "a")
    assert (g["hostname"], g["port"], g["user"]) == ("10.1.1.1", "2201", "from-glob")
    g = _ssh_g(side, "b")
    assert (g["hostname"], g["port"], g["user"]) == ("b", "22", "star")


def test_global_known_hosts_file_is_read_and_never_written(home, ssh_devices, ssh_client_key):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    shared = home / "fleet_known_hosts"  # what an admin puts in /etc/ssh/ssh_known_hosts
    shared.write_text(dev.known_hosts_line())
    mine = home / "mine"
    config = home / ".ssh" / "config"
    config.write_text(f"Host fleet\n  HostName 127.0.0.1\n  Port {dev.port}\n  User {dev.user}\n"
                      f"  IdentityFile {ssh_client_key}\n  UserKnownHostsFile {mine}\n"
                      f"  GlobalKnownHostsFile {shared}\n")
    assert _whoami("fleet") == dev.user
    assert not mine.exists() and shared.read_text() == dev.known_hosts_line()
    assert _ssh(config, "fleet", "-o", "StrictHostKeyChecking=yes", "id", "-un").stdout.strip() == dev.user
