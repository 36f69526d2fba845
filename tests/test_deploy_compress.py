"""``deploy --compress``: files go over the wire gzip-compressed where that pays, the device inflates them and
verifies the sha256 of the inflated file exactly as for a file sent as it is (issue 8, load time: transfer).

The bundle is a real one (tiny ONNX classifier, golden data, runner) whose artifact carries a 2 MB initializer
that is 80% zeros, as a pruned model's weights are: compressible, like real pruned/clustered artifacts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.deploy import build_bundle
from tests.fixtures.runner_output import report_doc
from toolkit.delivery.bundle import read_bundle, sha256_file, write_manifest
from toolkit.delivery.deployment import Device, HelperRefused
from toolkit.delivery.push import GZ_SUFFIX, push
from toolkit.devices import DeviceSpec, open_connection, parse_spec
from toolkit.model.manifest import read_manifest
from toolkit.model.vocabulary import HelperRefusal


def _sparse_bundle(out: Path) -> Path:
    import onnx
    from onnx import numpy_helper

    build_bundle(out, name="sparse", target_arch="x86_64", pad_mb=2, seed=3)
    artifact = out / "model.fp32.onnx"
    model = onnx.load(str(artifact))
    for index, init in enumerate(model.graph.initializer):
        if init.name == "pad":
            values = numpy_helper.to_array(init).copy()
            values[np.random.default_rng(0).random(values.size) < 0.8] = 0.0
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(values, "pad"))
    onnx.save(model, str(artifact))
    manifest = read_manifest(json.loads((out / "manifest.json").read_text()))
    record = dataclasses.replace(manifest.artifacts[0], sha256=sha256_file(artifact), bytes=artifact.stat().st_size)
    write_manifest(out, dataclasses.replace(manifest, artifacts=(record,)))
    return out


@pytest.fixture(scope="module")
def sparse_bundle(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("sparse")
    root.chmod(0o755)
    return _sparse_bundle(root / "b")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _runner_check(python: str, bundle_dir: Path) -> dict:  # type: ignore[type-arg]
    proc = subprocess.run([python, str(bundle_dir / "edgetk_runner.py"), "check", "--bundle", str(bundle_dir),
                           "--runs", "3"], capture_output=True, text=True, timeout=120, check=False)
    return report_doc(proc.stdout)


def test_local_compressed_push_inflates_verifies_and_runs(local_home, sparse_bundle, device_env):  # type: ignore[no-untyped-def]
    bundle = read_bundle(sparse_bundle)
    spec = DeviceSpec(name="local", python=str(device_env.python))
    with open_connection(spec) as conn:
        result = push(Device(spec, conn), bundle, compress=True)
    artifact = (sparse_bundle / "model.fp32.onnx").stat().st_size
    assert result.files_sent == result.files_total
    assert result.files_compressed >= 1
    assert result.bytes_uncompressed == result.bytes_total
    # the 80%-zero artifact crosses the link at well under half its size
    assert result.bytes_sent < result.bytes_total * 0.6
    print(f"\nFIGURE compressed push: {result.bytes_total} bytes in the bundle, {result.bytes_sent} on the wire "
          f"({result.bytes_sent / result.bytes_total:.2f}); artifact {artifact} bytes")
    current = local_home / ".edgetk" / "bundles" / "sparse" / "current"
    for f in bundle.files():
        assert _sha(current / f.path) == f.sha256
    assert not [p for p in current.rglob("*") if p.name.endswith(GZ_SUFFIX)]
    # the device env (numpy + onnxruntime, no toolkit) runs the inflated artifact with the right outputs
    doc = _runner_check(str(device_env.python), current.resolve())
    assert doc["ok"] is True, doc
    assert doc["reports"][0]["outputs_match"]["ok"] is True


def test_without_compress_nothing_changes(local_home, sparse_bundle):  # type: ignore[no-untyped-def]
    bundle = read_bundle(sparse_bundle)
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        result = push(Device(spec, conn), bundle)
    assert result.files_compressed == 0 and result.bytes_sent == result.bytes_total == result.bytes_uncompressed


def test_incompressible_files_go_as_they_are(local_home, deploy_bundle_factory):  # type: ignore[no-untyped-def]
    bundle = read_bundle(deploy_bundle_factory(name="noisy", pad_mb=1, seed=5))  # random floats: gzip saves <10%
    spec = DeviceSpec(name="local")
    with open_connection(spec) as conn:
        result = push(Device(spec, conn), bundle, compress=True)
    big = bundle.path / "model.fp32.onnx"
    assert result.bytes_sent >= big.stat().st_size  # the artifact itself went uncompressed
    for f in bundle.files():
        assert _sha(local_home / ".edgetk" / "bundles" / "noisy" / "current" / f.path) == f.sha256


class _Corrupting:
    """A connection that flips one byte in the middle of every compressed upload (a damaged transfer)."""

    def __init__(self, conn) -> None:  # type: ignore[no-untyped-def]
        self.conn = conn
        self.name = conn.name

    def put(self, local, remote, *, progress=None, offset=0):  # type: ignore[no-untyped-def]
        self.conn.put(local, remote, progress=progress, offset=offset)
        if remote.endswith(GZ_SUFFIX):
            path = Path(os.path.expanduser("~")) / remote
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))

    def __getattr__(self, item):  # type: ignore[no-untyped-def]
        return getattr(self.conn, item)


def test_damaged_compressed_upload_is_refused_and_repaired(local_home, sparse_bundle):  # type: ignore[no-untyped-def]
    bundle = read_bundle(sparse_bundle)
    spec = DeviceSpec(name="local")
    root = local_home / ".edgetk" / "bundles" / "sparse"
    with open_connection(spec) as conn:
        with pytest.raises(HelperRefused) as info:
            push(Device(spec, _Corrupting(conn)), bundle, compress=True)
        assert info.value.kind is HelperRefusal.INTEGRITY  # parsed where the answer is read
        assert "compressed upload" in info.value.message and "damaged" in info.value.message
        assert not (root / "current").exists()  # never switched to a damaged version
        again = push(Device(spec, conn), bundle, compress=True)
    assert again.files_compressed >= 1
    for f in bundle.files():
        assert _sha(root / "current" / f.path) == f.sha256
    assert not [p for p in root.rglob("*") if p.name.endswith(GZ_SUFFIX)]  # stale uploads cleaned by finish


def test_ssh_compressed_push(ssh_devices, ssh_client_key, sparse_bundle, device_python):  # type: ignore[no-untyped-def]
    (dev,) = ssh_devices(1)
    base = parse_spec(dev.spec)
    spec = DeviceSpec(name=dev.name, host=base.host, port=base.port, user=base.user,
                      identity_file=str(ssh_client_key), python=device_python)
    known = dev.workdir / "client_known_hosts"
    known.write_text(dev.known_hosts_line())
    bundle = read_bundle(sparse_bundle)
    with open_connection(spec, known_hosts=str(known)) as conn:
        result = push(Device(spec, conn), bundle, compress=True)
    assert result.files_compressed >= 1 and result.bytes_sent < result.bytes_total * 0.6
    current = dev.home / ".edgetk" / "bundles" / "sparse" / "current"
    for f in bundle.files():
        assert _sha(current / f.path) == f.sha256
