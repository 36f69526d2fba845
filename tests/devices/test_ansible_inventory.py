"""Ansible inventories as device lists, parsed by the real ``ansible-inventory`` (ansible-core), then used
against real loopback sshd devices (INI and YAML)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tests.fixtures.cli import run_edgetk
from tests.fixtures.home import Home
from toolkit.devices.inventory import load_inventory, resolve_specs
from toolkit.errors import MissingDependency, UsageError

pytestmark = [pytest.mark.ansible,
              pytest.mark.skipif(importlib.util.find_spec("ansible") is None,
                                 reason="ansible-core is the [ansible] extra (scripts/test installs it)")]

INI = """\
[lab]
pi1 ansible_host=10.0.0.11 ansible_port=2222 ansible_user=pi ansible_ssh_private_key_file=~/.ssh/lab edgetk_target=raspberry-pi-4
pi2 ansible_host=10.0.0.12 ansible_ssh_common_args='-o ProxyJump=bastion@10.0.0.1:2200 -o StrictHostKeyChecking=no'

[line2]
pi2
jetson1 ansible_host=10.0.0.21 ansible_python_interpreter=/opt/venv/bin/python3 edgetk_target=jetson-orin-nano

[arm:children]
lab

[here]
box ansible_connection=local
"""


def test_ini_groups_vars_and_limit_patterns(tmp_path: Path) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text(INI)
    specs = load_inventory(path)
    assert list(specs) == ["box", "jetson1", "pi1", "pi2"]  # natural name order
    box, jetson, pi1, pi2 = specs.values()
    assert (pi1.host, pi1.port, pi1.user, pi1.target) == ("10.0.0.11", 2222, "pi", "raspberry-pi-4")
    assert pi1.identity_file == str(Path("~/.ssh/lab").expanduser()) and pi1.groups == ("arm", "lab")
    assert pi2.proxy_jump == "bastion@10.0.0.1:2200" and pi2.groups == ("arm", "lab", "line2")
    assert jetson.python == "/opt/venv/bin/python3" and jetson.port is None
    assert box.is_local and box.groups == ("here",)

    limited = resolve_specs((), inventory=path, group=None, limit="arm:&line2")
    assert [s.name for s in limited] == ["pi2"]
    assert [s.name for s in resolve_specs((), inventory=path, group="line2", limit="all:!jetson1")] == ["pi2"]
    with pytest.raises(UsageError, match="no hosts match --limit"):
        load_inventory(path, limit="nothing-like-this")


def test_yaml_directory_with_group_vars(tmp_path: Path) -> None:
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    pis:\n      hosts:\n        pi-a:\n          ansible_host: 10.1.0.1\n"
        "        pi-b:\n          ansible_host: 10.1.0.2\n          edgetk_target: raspberry-pi-5\n"
    )
    (inv / "group_vars" / "pis.yml").write_text("ansible_user: ops\nedgetk_target: raspberry-pi-4\nansible_port: 2201\n")
    specs = load_inventory(inv)
    assert [(s.name, s.host, s.user, s.port, s.target) for s in specs.values()] == [
        ("pi-a", "10.1.0.1", "ops", 2201, "raspberry-pi-4"),
        ("pi-b", "10.1.0.2", "ops", 2201, "raspberry-pi-5"),  # the host's own var wins over the group's
    ]


def test_bad_inventories_are_plain_errors(tmp_path: Path) -> None:
    typo = tmp_path / "typo.ini"
    typo.write_text("[lab]\npi1 ansible_host=10.0.0.1 edgetk_traget=raspberry-pi-4\n")
    with pytest.raises(UsageError, match="edgetk_traget") as info:
        load_inventory(typo)
    assert "edgetk_target" in (info.value.hint or "")
    broken = tmp_path / "broken.yml"
    broken.write_text("all:\n  hosts: [unclosed\n")
    with pytest.raises(UsageError, match="Ansible could not read the inventory"):
        load_inventory(broken)


def test_without_ansible_core_the_message_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import toolkit.devices.ansible_inventory as mod

    path = tmp_path / "hosts.ini"
    path.write_text(INI)
    monkeypatch.setattr(mod.sys, "executable", str(tmp_path / "no-venv" / "python"))  # no ansible-inventory beside it
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("ansible-inventory") is None
    with pytest.raises(MissingDependency) as info:
        load_inventory(path)
    assert "edge-toolkit[ansible]" in (info.value.hint or "")


@pytest.mark.ssh
@pytest.mark.parametrize("form", ["ini", "yml"])
def test_deploy_and_check_through_an_ansible_inventory(form, ssh_devices, ssh_client_key, ssh_known_hosts,  # type: ignore[no-untyped-def]
                                                       tiny_deploy_bundle, device_python, tmp_path):
    devices = ssh_devices(2)
    known = ssh_known_hosts(*devices)
    common = (f"ansible_ssh_private_key_file={ssh_client_key} ansible_python_interpreter={device_python} "
              f"edgetk_known_hosts={known}")
    if form == "ini":
        path = tmp_path / "hosts.ini"
        path.write_text("[lab]\n" + "".join(
            f"d{i} ansible_host=127.0.0.1 ansible_port={d.port} ansible_user={d.user}\n" for i, d in enumerate(devices))
            + "[other]\nd9 ansible_host=127.0.0.1 ansible_port=9\n"
            + f"[lab:vars]\n{common.replace(' ', chr(10))}\n")
    else:
        path = tmp_path / "hosts.yml"
        hosts = "".join(f"        d{i}:\n          ansible_host: 127.0.0.1\n          ansible_port: {d.port}\n"
                        f"          ansible_user: {d.user}\n" for i, d in enumerate(devices))
        lab_vars = "".join(f"        {kv.split('=', 1)[0]}: {kv.split('=', 1)[1]}\n" for kv in common.split())
        path.write_text(f"all:\n  children:\n    lab:\n      hosts:\n{hosts}      vars:\n{lab_vars}"
                        "    other:\n      hosts:\n        d9:\n          ansible_port: 9\n")
    env = Home(tmp_path).env
    group = ("--group", "lab") if form == "ini" else ("--limit", "lab")
    result = run_edgetk("deploy", tiny_deploy_bundle, "--inventory", path, *group, "--check", "--waves", "1,100%",
                        "--runs", "3", "--budget-ms", "100000", "--baseline", "none", "--json", env=env)
    assert result.code == 0, result.stderr
    doc = result.json()
    assert [d["device"] for d in doc["devices"]] == ["d0", "d1"]
    assert all(d["reports"][0]["outputs_match"]["ok"] for d in doc["devices"])
    assert [w["devices"] for w in doc["rollout"]["waves"]] == [["d0"], ["d1"]] and doc["rollout"]["stopped"] is None
    assert "wave 2: 1 device(s), 0 failed" in result.stderr
    status = run_edgetk("status", "--inventory", path, "--limit", "lab:!d0", "--json", env=env)
    assert status.code == 0, status.stderr
    (only,) = status.json()["devices"]
    assert only["device"] == "d1" and "tiny" in only["bundles"]
