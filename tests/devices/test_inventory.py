"""Device specs and the TOML inventory: forms, validation messages with file and key, groups, fleet results."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.devices.fleet import run_fleet
from toolkit.devices.inventory import load_inventory, select
from toolkit.devices.spec import DeviceSpec, parse_spec
from toolkit.errors import DeviceError, UsageError

INVENTORY = """
[devices.pi-lab-1]
host = "192.168.1.40"
port = 2222
user = "pi"
identity_file = "~/.ssh/id_ed25519"
python = "/home/pi/venv/bin/python"
target = "raspberry-pi-4"
groups = ["lab", "line-2"]

[devices.box]
host = "local"
groups = ["line-2"]
"""


def test_specs() -> None:
    assert parse_spec("local").is_local
    s = parse_spec("pi@10.0.0.5:2200")
    assert (s.user, s.host, s.port, s.name) == ("pi", "10.0.0.5", 2200, "pi@10.0.0.5:2200")
    assert parse_spec("jetson-alias").host == "jetson-alias" and parse_spec("jetson-alias").user is None
    assert parse_spec("root@[::1]:22").host == "::1"
    for bad in ("a b", "pi@host:99999", "x;rm -rf", "@host", "pi@"):
        with pytest.raises(UsageError):
            parse_spec(bad)


def test_inventory(tmp_path: Path) -> None:
    path = tmp_path / "inv.toml"
    path.write_text(INVENTORY)
    devices = load_inventory(path)
    pi = devices["pi-lab-1"]
    assert (pi.host, pi.port, pi.user, pi.target, pi.groups) == ("192.168.1.40", 2222, "pi", "raspberry-pi-4",
                                                                 ("lab", "line-2"))
    assert devices["box"].is_local
    assert parse_spec("pi-lab-1", inventory=devices) is pi
    assert [d.name for d in select(devices, group="line-2", where="x")] == ["pi-lab-1", "box"]
    with pytest.raises(UsageError, match="no device is in the group 'lba'") as err:
        select(devices, group="lba", where="x")
    assert "Did you mean 'lab'" in (err.value.hint or "")


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[devices.pi]\nhots = "x"\n', "unknown key 'hots'"),
        ('[devices.pi]\nport = 22\n', "'host' is missing"),
        ('[devices.pi]\nhost = "x"\nport = "abc"\n', "port must be a number"),
        ('[devices.pi]\nhost = "x"\nport = 70000\n', "between 1 and 65535"),
        ('[devices.pi]\nhost = "x"\ngroups = "lab"\n', "'groups' must be a list"),
        ('[device.pi]\nhost = "x"\n', "unknown top-level key 'device'"),
        ("[devices]\n", "no devices defined"),
        ('[devices."a b"]\nhost = "x"\n', "device name must use only"),
        ("[devices.pi\n", "not valid TOML"),
    ],
)
def test_inventory_errors_name_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "inv.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        load_inventory(path)
    assert needle in err.value.message and str(path) in err.value.message


def test_fleet_keeps_going_and_worst_exit_wins() -> None:
    specs = [DeviceSpec(name=f"d{i}") for i in range(5)]

    def task(spec: DeviceSpec) -> str:
        if spec.name == "d1":
            raise DeviceError("d1 down")
        if spec.name == "d3":
            raise UsageError("bad flag")  # exit 2: the device error's 4 is still the worst
        return spec.name.upper()

    result = run_fleet(specs, task, parallel=3)
    assert [o.device for o in result.outcomes] == [s.name for s in specs]
    assert [o.value for o in result.succeeded] == ["D0", "D2", "D4"]
    assert [o.device for o in result.failed] == ["d1", "d3"]
    assert result.exit_code == 4


def test_a_device_home_is_a_directory_of_its_own(tmp_path: Path) -> None:
    """``home``: where the toolkit keeps its files on the device, as the connection's paths say it."""
    from toolkit.devices.spec import device_home

    assert DeviceSpec(name="d").base == ".edgetk"
    assert (device_home("/data/edgetk/"), device_home("~/edgetk"), device_home("edgetk")) == (
        "/data/edgetk", "edgetk", "edgetk")
    inv = tmp_path / "inv.toml"
    inv.write_text('[devices.ro]\nhost = "10.0.0.9"\nhome = "/data/edgetk"\n')
    assert load_inventory(inv)["ro"].base == "/data/edgetk"
    for bad in ("/", "~", "/data/../etc", "~root/x"):
        inv.write_text(f'[devices.ro]\nhost = "10.0.0.9"\nhome = "{bad}"\n')
        with pytest.raises(UsageError) as caught:
            load_inventory(inv)
        assert f"{inv}: [devices.ro] home" in caught.value.message and "/data/edgetk" in (caught.value.hint or "")
