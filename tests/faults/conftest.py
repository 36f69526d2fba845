"""Shared by the fault tests: a device behind the controllable link (tests/fixtures/netns.py) with an inventory,
known_hosts and a private HOME for the CLI, and a deploy + check that verifies every file on the device."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.netns import NetLab
from tests.fixtures.home import Home, new_home
from toolkit.delivery.bundle import read_bundle

NO_GATES = ("--budget-ms", "100000", "--baseline", "none")


@dataclass(frozen=True)
class Field:
    lab: NetLab
    inventory: Path
    known_hosts: Path
    env: dict[str, str]
    root: Path
    python: str
    key: Path

    @property
    def bundles(self) -> Path:
        return self.lab.device.home / ".edgetk" / "bundles"


@pytest.fixture(scope="module")
def field(netlab: NetLab, ssh_client_key: Path, device_env, tmp_path_factory: pytest.TempPathFactory) -> Field:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("field")
    home = new_home(root).path
    known = root / "known_hosts"
    known.write_text(netlab.device.known_hosts_line())
    inventory = netlab.inventory(root / "inv.toml", python=str(device_env.python), key=ssh_client_key,
                                 known_hosts=known)
    env = Home(home).env
    return Field(netlab, inventory, known, env, root, str(device_env.python), ssh_client_key)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wait_for(predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def deploy_and_check(field: Field, bundle_path: Path, *, inventory: Path | None = None, full: bool = True) -> dict:  # type: ignore[type-arg]
    """Full deploy + check through the CLI; every file verified on the device; returns the push record."""
    result = field.lab.cli("deploy", bundle_path, "--inventory", inventory or field.inventory, "--check",
                           *NO_GATES, "--runs", "5", "--warmup", "1", "--json", env=field.env)
    assert result.code == 0, result.stderr[-3000:]
    (entry,) = result.json()["devices"]
    push = entry["deploy"]
    if full:  # a new bundle name: every byte crossed the link
        assert push["files_sent"] == push["files_total"] and push["bytes_sent"] == push["bytes_total"]
    (report,) = entry["reports"]
    assert report["error"] is None and report["outputs_match"]["ok"] is True, report
    assert report["latency_ms"]["p50"] > 0 and report["gates"]["passed"]
    bundle = read_bundle(bundle_path)
    current = field.bundles / bundle.name / "current"
    assert os.readlink(current) == bundle.version
    for f in bundle.files():
        assert _sha(current / f.path) == f.sha256, f.path
    return push  # type: ignore[no-any-return]


