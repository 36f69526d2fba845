"""Mender artifacts with the real tools: ``edgetk export --mender`` written by ``mender-artifact`` and checked
with ``mender-artifact read/validate``; then Debian's mender-client in standalone mode (``mender install``,
``commit``, ``rollback``) on a test device root: install + commit, a failing check that rolls back, an
interrupted install that leaves ``current`` untouched, and ``edgetk history import`` of the device's report.

What cannot exist here: a Mender server (the server side is documented in docs/devices.md, untested). The
client's Update Modules live in a fixed system folder, so the module is installed as
/usr/share/mender/modules/v3/edgetk for the test (root needed; removed afterwards if it was not there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.cli import run_edgetk

MODULE = Path("/usr/share/mender/modules/v3/edgetk")
ARTIFACT_INFO = Path("/etc/mender/artifact_info")

pytestmark = [pytest.mark.mender,
              pytest.mark.skipif(shutil.which("mender-artifact") is None or shutil.which("mender") is None,
                                 reason="mender-artifact and mender-client are Debian packages (scripts/test installs them)")]


@dataclass
class MenderDevice:
    root: Path
    env: dict[str, str]

    @property
    def home(self) -> Path:
        return self.root / "home"

    def mender(self, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        argv = ["mender", "--no-syslog", "--log-level", os.environ.get("EDGETK_TEST_MENDER_LOG", "error"), "--config", str(self.root / "mender.conf"),
                "--fallback-config", str(self.root / "fallback.conf"), "--data", str(self.root / "data"), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**self.env, **(extra_env or {})})

    def current(self, name: str) -> str | None:
        link = self.home / ".edgetk" / "bundles" / name / "current"
        return os.readlink(link) if link.is_symlink() else None


@pytest.fixture
def mender_device(tmp_path: Path, device_python: str) -> Iterator[MenderDevice]:
    if os.geteuid() != 0:
        pytest.skip("mender-client's Update Modules folder is a system path: the test needs root (CI runs as root)")
    from toolkit import device_side

    created = []
    previous_module = MODULE.read_bytes() if MODULE.exists() else None
    MODULE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(device_side.source_path("mender_module.py"), MODULE)  # this checkout's module
    MODULE.chmod(0o755)
    if not ARTIFACT_INFO.exists():  # a Mender image has it; the standalone client refuses to start without it
        ARTIFACT_INFO.parent.mkdir(parents=True, exist_ok=True)
        ARTIFACT_INFO.write_text("artifact_name=edgetk-test-initial\n")
        created.append(ARTIFACT_INFO)
    root = tmp_path / "device"
    for sub in ("data/scripts", "home"):
        (root / sub).mkdir(parents=True)
    (root / "data" / "device_type").write_text("device_type=raspberrypi4\n")
    (root / "mender.conf").write_text("{}")
    (root / "fallback.conf").write_text("{}")
    env = dict(os.environ, EDGETK_MENDER_HOME=str(root / "home"), EDGETK_MENDER_PYTHON=device_python,
               EDGETK_DEVICE_NAME="pi-mender-1")
    yield MenderDevice(root, env)
    for path in created:
        path.unlink(missing_ok=True)
    if previous_module is None:
        MODULE.unlink(missing_ok=True)
    else:
        MODULE.write_bytes(previous_module)


def _export(bundle: Path, out: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    result = run_edgetk("export", bundle, "--mender", "--device-type", "raspberrypi4", "-o", out, "--runs", "3",
                        *extra, "--json")
    assert result.code == 0, result.stderr
    return result.json()  # type: ignore[no-any-return]


def test_export_writes_a_valid_module_image_artifact(deploy_bundle_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = deploy_bundle_factory(name="menderx", seed=0)
    doc = _export(bundle, tmp_path / "b.mender", "--budget-ms", "100000")
    assert doc["type"] == "edgetk" and doc["device_types"] == ["raspberrypi4"]
    validate = subprocess.run(["mender-artifact", "validate", str(tmp_path / "b.mender")], capture_output=True, text=True)
    assert validate.returncode == 0, validate.stderr
    read = subprocess.run(["mender-artifact", "read", str(tmp_path / "b.mender")], capture_output=True, text=True)
    assert read.returncode == 0
    for needle in ("Type:   edgetk", "'[raspberrypi4]'", "bundle.tar", "device_helper.py", "edgetk-meta.json",
                   f"rootfs-image.menderx.version: {doc['version'][:12]}"):
        assert needle in read.stdout, (needle, read.stdout)
    again = run_edgetk("export", bundle, "--mender", "--device-type", "raspberrypi4", "-o", tmp_path / "b.mender")
    assert again.code == 2 and "--force" in again.stderr
    untyped = run_edgetk("export", bundle, "--mender", "-o", tmp_path / "c.mender")
    assert untyped.code == 2 and "--device-type" in untyped.stderr and "Traceback" not in untyped.stderr


def test_install_commit_failing_check_rollback_and_interrupted_install(  # type: ignore[no-untyped-def]
        mender_device: MenderDevice, deploy_bundle_factory, tmp_path: Path) -> None:
    dev = mender_device
    good = _export(deploy_bundle_factory(name="menderb", seed=0), tmp_path / "v1.mender", "--budget-ms", "100000")
    # the same bundle name, new weights, and a budget no device meets: its check fails on the device
    slow = _export(deploy_bundle_factory(name="menderb", seed=1), tmp_path / "v2.mender", "--budget-ms", "0.000001")
    assert good["version"] != slow["version"]

    installed = dev.mender("install", str(tmp_path / "v1.mender"))
    assert installed.returncode == 0, installed.stderr
    assert dev.current("menderb") == good["version"]
    committed = dev.mender("commit")
    assert committed.returncode == 0, committed.stderr
    (report,) = (dev.home / ".edgetk" / "reports").glob("menderb-*.json")
    record = json.loads(report.read_text())
    assert record["passed"] is True and record["device"] == "pi-mender-1"
    assert record["runner"]["reports"][0]["outputs_match"]["ok"] is True

    # a check that fails its gate at commit: Mender rolls back to v1
    assert dev.mender("install", str(tmp_path / "v2.mender")).returncode == 0
    assert dev.current("menderb") == slow["version"]
    failed = dev.mender("commit")
    assert failed.returncode != 0
    assert dev.current("menderb") == good["version"]
    reports = sorted((dev.home / ".edgetk" / "reports").glob("menderb-*.json"))
    assert len(reports) == 2
    failing = [json.loads(p.read_text()) for p in reports if not json.loads(p.read_text())["passed"]]
    assert failing and "exceeds the budget" in failing[0]["reasons"][0]

    # an install cut off (the module killed) after the files are in place but before the switch
    cut = dev.mender("install", str(tmp_path / "v2.mender"), extra_env={"EDGETK_MENDER_TEST_STOP_BEFORE_SWITCH": "1"})
    assert cut.returncode != 0
    assert dev.current("menderb") == good["version"]
    # and the device still takes the next update (the dead install's lock is broken, not waited for)
    assert dev.mender("install", str(tmp_path / "v2.mender")).returncode == 0
    assert dev.current("menderb") == slow["version"]
    rolled = dev.mender("rollback")
    assert rolled.returncode == 0, rolled.stderr
    assert dev.current("menderb") == good["version"]

    # the reports the device left go into the history
    store = tmp_path / "history.sqlite"
    imported = run_edgetk("history", "import", dev.home / ".edgetk" / "reports", "--store", store, "--json")
    assert imported.code == 0, imported.stderr
    assert imported.json()["checks"] == 2
    twice = run_edgetk("history", "import", dev.home / ".edgetk" / "reports", "--store", store, "--json")
    assert twice.code == 0
    listed = run_edgetk("history", "--store", store, "--json").json()
    assert len(listed) == 2 and {c["passed"] for c in listed} == {True, False}
    assert {c["device"] for c in listed} == {"pi-mender-1"} and {c["bundle"] for c in listed} == {"menderb"}


def test_update_module_is_python_36_stdlib() -> None:
    import sys

    from toolkit import device_side

    module = device_side.source_path("mender_module.py")
    vermin = Path(sys.executable).parent / "vermin"
    result = subprocess.run([str(vermin), "--target=3.6-", "--no-tips", "--violations", str(module)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "toolkit" not in "".join(line for line in module.read_text().splitlines() if line.startswith(("import", "from")))
