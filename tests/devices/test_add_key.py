"""First boot (issue 24): ``edgetk devices add-key`` installs the user's key over a password login on real servers
(OpenSSH on loopback with password login, the Dropbear/busybox stand-in), proves key login afterwards, records the
host key only with --trust-new-host (a changed key always refused), and never shows the password: not on stdout,
stderr, in --debug output, in errors, or in any file it writes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.cli import REPO, CliResult
from tests.fixtures.dropbear import DropbearDevice
from tests.fixtures.sshd import SshDevice

PASSWORD = "first-Boot-s3cret"


def _edgetk(*args: str | os.PathLike[str], env: dict[str, str] | None = None) -> CliResult:
    """edgetk as a script or a fleet job runs it: no terminal on stdin."""
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def user_key(tmp_path: Path) -> Path:
    key = tmp_path / "id_first_boot"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "first boot", "-f", str(key)], check=True)
    return key


def _set_password(user: str) -> None:
    subprocess.run(["chpasswd"], input=f"{user}:{PASSWORD}\n", text=True, check=True, capture_output=True)


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text


@pytest.mark.ssh
def test_add_key_on_openssh_with_a_password(fresh_ssh_device: Callable[..., SshDevice], user_key: Path,
                                            tmp_path: Path) -> None:
    device = fresh_ssh_device(PasswordAuthentication="yes", AuthorizedKeysFile=".ssh/authorized_keys",
                              StrictModes="yes")
    _set_password(device.user)
    known = tmp_path / "known_hosts"
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    args: list[str | os.PathLike[str]] = ["devices", "add-key", "--device", device.spec, "--key", f"{user_key}.pub",
                                         "--known-hosts", known]

    # no terminal, no password source: how to give one, exit 2, before any connection
    missing = _edgetk(*args)
    assert missing.code == 2 and "--password-file" in missing.stderr and "--password-env" in missing.stderr
    # an unknown host key is refused without the opt-in; nothing is written anywhere
    unknown = _edgetk(*args, "--password-file", secret)
    assert unknown.code == 4 and "--trust-new-host" in unknown.stderr
    assert not known.exists() and not (device.home / ".ssh").exists()
    # a wrong password: refused, and the message carries neither password
    wrong = _edgetk("--debug", *args, "--trust-new-host", "--password-env", "EDGETK_TEST_PW",
                    env={"EDGETK_TEST_PW": "not-the-password"})
    assert wrong.code == 4 and "refused the password" in wrong.stderr
    (said,) = [line for line in wrong.stderr.splitlines() if line.startswith("error: ")]
    assert said.count(device.spec) == 1, said  # the device named once (it was three times)
    assert "not-the-password" not in wrong.stdout + wrong.stderr

    done = _edgetk("--debug", *args, "--trust-new-host", "--password-env", "EDGETK_TEST_PW", "--json",
                   env={"EDGETK_TEST_PW": PASSWORD})
    assert done.code == 0, done.stderr
    _no_secret(done.stdout, done.stderr)
    entry = done.json()["devices"][0]["add_key"]
    assert entry["added"] == [".ssh/authorized_keys"] and entry["key_login"] is True and entry["password_used"]
    public = Path(f"{user_key}.pub").read_text().strip()
    assert (device.home / ".ssh" / "authorized_keys").read_text() == public + "\n"
    assert (device.home / ".ssh").stat().st_mode & 0o777 == 0o700
    assert (device.home / ".ssh" / "authorized_keys").stat().st_mode & 0o777 == 0o600
    assert device.known_hosts_line().split()[1:] == known.read_text().split()[1:3]  # recorded as probe does
    _no_secret(known.read_text(), (device.home / ".ssh" / "authorized_keys").read_text())

    # key login now works with no password at all: the toolkit's own commands over that key alone
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(device.inventory_entry(identity_file=str(user_key)))
    status = _edgetk("status", "--inventory", inventory, "--known-hosts", known, "--json")
    assert status.code == 0, status.stderr
    again = _edgetk(*args, "--password-file", secret, "--json")
    assert again.code == 0 and again.json()["devices"][0]["add_key"]["present"] == [".ssh/authorized_keys"]
    assert (device.home / ".ssh" / "authorized_keys").read_text().count("ssh-ed25519") == 1  # not added twice
    # once a key login works, no password is asked for, nor needed from any source
    keyed = _edgetk(*args, "--json")
    assert keyed.code == 0, keyed.stderr
    assert keyed.json()["devices"][0]["add_key"]["password_used"] is False
    assert again.json()["devices"][0]["add_key"]["password_used"] is False
    # the same through the API, its answer typed (a KeyInstall), its document the CLI's entry
    from toolkit import api

    report = api.add_key(devices=[device.spec], public_key=f"{user_key}.pub", known_hosts=known)
    answer = report.devices[0].answer
    assert report.exit_code == 0 and answer is not None
    assert answer.add_key.present == (".ssh/authorized_keys",) and answer.add_key.added == ()
    assert answer.add_key.key_login and not answer.add_key.password_used
    assert answer.to_dict() == {"add_key": keyed.json()["devices"][0]["add_key"]}

    # a changed host key is refused even with --trust-new-host
    device.regenerate_host_key()
    changed = _edgetk(*args, "--trust-new-host", "--password-file", secret)
    assert changed.code == 4 and "CHANGED" in changed.stderr
    _no_secret(changed.stdout, changed.stderr)


@pytest.mark.dropbear
def test_add_key_on_a_busybox_dropbear_first_boot(fresh_dropbear_device: Callable[..., DropbearDevice],
                                                  user_key: Path, tmp_path: Path) -> None:
    device = fresh_dropbear_device(password=PASSWORD, home_mb=8)
    authorized = device.home / ".ssh" / "authorized_keys"
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnownOtherKeyXXXXXXXXXXXXXXXXXXXXXXXXXXXXX admin"
    authorized.write_text(other)  # a key already there, its line not ended: ours must not join it
    known = tmp_path / "known_hosts"
    secret = tmp_path / "password"
    secret.write_text(PASSWORD)
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(device.inventory_entry(identity_file=str(user_key), python=device.python))
    # before: a key login is refused, and the message names the way in
    before = _edgetk("status", "--inventory", inventory, "--known-hosts", known, "--trust-new-host")
    assert before.code == 4 and f"edgetk devices add-key --device {device.name}" in before.stderr
    done = _edgetk("--debug", "devices", "add-key", "--inventory", inventory, "--key", user_key, "--known-hosts",
                   known, "--trust-new-host", "--password-file", secret, "--json")
    assert done.code == 0, done.stderr
    _no_secret(done.stdout, done.stderr)
    entry = done.json()["devices"][0]["add_key"]
    assert entry["key_login"] is True and entry["added"] == [".ssh/authorized_keys"]
    public = Path(f"{user_key}.pub").read_text().strip()
    assert authorized.read_text() == f"{other}\n{public}\n"
    # what the rest of the toolkit does next works over that key alone (status runs the device helper)
    status = _edgetk("status", "--inventory", inventory, "--known-hosts", known, "--json")
    assert status.code == 0, status.stderr
    assert status.json()["devices"][0]["bundles"] == {}
