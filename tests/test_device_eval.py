"""The device proves accuracy (check --eval) and names the first diverging layer when its outputs differ.

Real parts only: the trained digits CNN converted by the real pipeline (fp32 + INT8, TFLite and ONNX) with
``--device-eval``, deployed to the ``local`` device and to a loopback OpenSSH device, run by the bundle's own
runner. The broken artifacts are real INT8 artifacts whose second convolution's weight scale was multiplied by
three (and the manifest re-hashed, as a faulty re-quantization would ship them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.bundles import copy_bundle
from tests.test_gates_device import local  # noqa: F401 - the `local` device fixture (a private HOME)
from toolkit.bundle import read_bundle, sha256_file
from toolkit.checking import GateOptions, check
from toolkit.deployment import Device, push, version_dir
from toolkit.devices.spec import DeviceSpec, parse_spec
from toolkit.pipeline import ConvertOptions, ConvertResult, convert_bundle
from toolkit.reporting.html import collect, render_html
from toolkit.reporting.terminal import bundle_table
from toolkit.store import Store

BROKEN_ONNX_LAYER = "digits_1/conv2d_1_2/BiasAdd"  # the second Conv node of the INT8 ONNX
BROKEN_TFLITE_LAYER = ("digits_1/conv2d_1_2/Relu;digits_1/conv2d_1_2/BiasAdd;digits_1/conv2d_1_2/convolution;"
                       "digits_1/conv2d_1_2/Squeeze1")


@pytest.fixture(scope="session")
def eval_bundle(digits_keras: Path, digits_calibration: Path, digits_eval: Path,
                tmp_path_factory: pytest.TempPathFactory) -> ConvertResult:
    return convert_bundle(
        ConvertOptions(source=str(digits_keras), calibration=digits_calibration, eval_data=digits_eval,
                       precisions=("fp32", "int8"), formats=("tflite", "onnx"), device_eval=497,
                       out=tmp_path_factory.mktemp("eval") / "digits", use_cache=False),
        progress=lambda message: None,
    )


def _rehash(bundle_dir: Path, artifact: str) -> None:
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    for record in manifest["artifacts"]:
        if record["file"] == artifact:
            record["sha256"] = sha256_file(bundle_dir / artifact)
            record["bytes"] = (bundle_dir / artifact).stat().st_size
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _break_onnx(bundle_dir: Path) -> None:
    """Triple the weight scale of the second convolution of the INT8 ONNX artifact."""
    import onnx
    from onnx import numpy_helper

    path = bundle_dir / "model.int8.onnx"
    model = onnx.load(str(path))
    conv = next(n for n in model.graph.node if n.name == BROKEN_ONNX_LAYER)
    dq = next(n for n in model.graph.node if conv.input[1] in n.output)
    init = next(i for i in model.graph.initializer if i.name == dq.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(3.0), init.name))
    onnx.save(model, str(path))
    _rehash(bundle_dir, "model.int8.onnx")


def _break_tflite(bundle_dir: Path) -> None:
    """Triple the weight scales of the second convolution of the INT8 TFLite artifact."""
    from ai_edge_litert.tools import flatbuffer_utils

    path = bundle_dir / "model.int8.tflite"
    model = flatbuffer_utils.read_model(str(path))
    graph = model.subgraphs[0]
    names = [t.name.decode() if isinstance(t.name, bytes) else t.name for t in graph.tensors]
    target = names.index(BROKEN_TFLITE_LAYER)
    op = next(o for o in graph.operators if target in list(o.outputs))
    weights = graph.tensors[op.inputs[1]]
    weights.quantization.scale = [s * 3.0 for s in weights.quantization.scale]
    flatbuffer_utils.write_model(model, str(path))
    _rehash(bundle_dir, "model.int8.tflite")


def test_eval_set_runs_on_the_device_and_matches_the_host(eval_bundle: ConvertResult, local: Device,
                                                          tmp_path: Path) -> None:
    bundle = read_bundle(eval_bundle.bundle_dir)
    assert not any(f.path.startswith("eval/") or f.path.startswith("layers/") for f in bundle.files())  # deploy stays small
    push(local, bundle)
    store = Store(tmp_path / "history.sqlite")
    reports = check(local, bundle, runs=3, warmup=0, gates=GateOptions(baseline="none"), evaluate=True,
                    store=store)
    records = {a.file: a for a in bundle.manifest.artifacts}
    assert len(reports) == 4
    for report in reports:
        result = report.evaluation
        assert result is not None and result["available"], result
        assert result["samples"] == 497 and result["labels"] is True and result["note"] is None
        host = records[report.artifact].verification
        assert host is not None
        # the local device IS this host: the same artifact in the same runtime scores what convert measured
        assert result["vs_labels"]["device_accuracy"] == pytest.approx(host.accuracy, abs=1e-9)
        assert result["vs_labels"]["float_accuracy"] == pytest.approx(host.reference_accuracy, abs=1e-9)
        assert result["vs_float"]["top1_agreement"] == pytest.approx(host.top1_agreement, abs=1e-9)
        assert result["vs_labels"]["device_accuracy"] > 0.9  # a trained model
        assert report.to_dict()["evaluation"] == result
    # side by side in the terminal table and in the HTML report read back from the history
    text = bundle_table(bundle.manifest, reports)
    assert "the eval set on the device (--eval):" in text
    assert "eval set on the device (497 samples" in text and "vs the float model" in text, text
    page = render_html(collect(eval_bundle.bundle_dir, store=tmp_path / "history.sqlite"))
    assert "The eval set on the device" in page and 'id="evaluation"' in page
    # a chunk smaller than the set: the same outputs, read and written chunk by chunk
    vdir = Path(local.conn._path(version_dir(bundle.name, bundle.version)))  # type: ignore[attr-defined]
    runner = [sys.executable, str(vdir / "edgetk_runner.py"), "eval", "--bundle", str(vdir), "--artifact",
              "model.int8.onnx"]
    whole = json.loads(subprocess.run([*runner, "--out", str(vdir / "a")], capture_output=True, text=True,
                                      check=True).stdout)
    chunked = json.loads(subprocess.run([*runner, "--out", str(vdir / "b"), "--chunk", "100"], capture_output=True,
                                        text=True, check=True).stdout)
    assert chunked["chunks"] == 1 + 5 and chunked["chunk"] == 100, chunked  # one sample sizes the chunks
    assert whole["chunk"] == 497 and whole["chunks"] == 2, whole
    assert whole["outputs"][0]["dtype"] == "uint8" or whole["outputs"][0]["dtype"] == "float32"
    assert np.array_equal(np.load(vdir / "a" / "output_0.npy"), np.load(vdir / "b" / "output_0.npy"))


def test_eval_without_labels_reports_float_agreement_only(eval_bundle: ConvertResult, local: Device,
                                                          tmp_path: Path) -> None:
    bundle_dir = copy_bundle(eval_bundle.bundle_dir, tmp_path / "nolabels")
    (bundle_dir / "eval" / "labels.npy").unlink()
    bundle = read_bundle(bundle_dir)
    push(local, bundle)
    (report, *_) = check(local, bundle, runs=2, warmup=0, gates=GateOptions(baseline="none"), evaluate=True)
    result = report.evaluation
    assert result is not None and result["available"] and result["labels"] is False
    assert result["vs_labels"] is None and "no labels" in result["note"]
    assert result["vs_float"]["top1_agreement"] is not None


def test_broken_layer_is_named_on_local(eval_bundle: ConvertResult, local: Device, tmp_path: Path) -> None:
    bundle_dir = copy_bundle(eval_bundle.bundle_dir, tmp_path / "broken")
    _break_onnx(bundle_dir)
    _break_tflite(bundle_dir)
    bundle = read_bundle(bundle_dir)
    push(local, bundle)
    reports = {r.artifact: r for r in check(local, bundle, runs=2, warmup=0, gates=GateOptions(baseline="none"))}
    for artifact, layer in (("model.int8.onnx", BROKEN_ONNX_LAYER), ("model.int8.tflite", BROKEN_TFLITE_LAYER)):
        report = reports[artifact]
        assert not report.gates.passed
        found = report.gates.details["divergence"]
        assert found["available"], found
        assert found["first"]["layer"] == layer, found
        earlier = found["layers"][: [e["layer"] for e in found["layers"]].index(layer)]
        assert earlier and not any(e["diverged"] for e in earlier), found  # layers before it agree
        (failure,) = [f for f in report.gates.failures if "outputs differ" in f]
        assert f"first diverging layer: {layer}" in failure, failure
        print(f"\n{failure}")
    for artifact in ("model.fp32.onnx", "model.fp32.tflite"):
        assert reports[artifact].gates.passed, reports[artifact].gates.failures
        assert "divergence" not in reports[artifact].gates.details


@pytest.mark.ssh
def test_eval_and_divergence_over_ssh(eval_bundle: ConvertResult, ssh_devices, ssh_client_key,  # type: ignore[no-untyped-def]
                                      device_python: str, tmp_path: Path) -> None:
    from toolkit.devices import open_connection

    (dev,) = ssh_devices(1)
    base = parse_spec(dev.spec)
    spec = DeviceSpec(name=dev.name, host=base.host, port=base.port, user=base.user,
                      identity_file=str(ssh_client_key), python=device_python)
    known = tmp_path / "known_hosts"
    known.write_text(dev.known_hosts_line())
    bundle_dir = copy_bundle(eval_bundle.bundle_dir, tmp_path / "broken")
    _break_onnx(bundle_dir)
    bundle = read_bundle(bundle_dir)
    with open_connection(spec, known_hosts=str(known)) as conn:
        device = Device(spec, conn)
        push(device, bundle)
        reports = {r.artifact: r for r in check(device, bundle, runs=2, warmup=0, gates=GateOptions(baseline="none"),
                                                 evaluate=True)}
    broken = reports["model.int8.onnx"]
    assert broken.gates.details["divergence"]["first"]["layer"] == BROKEN_ONNX_LAYER
    good = reports["model.int8.tflite"].evaluation
    assert good is not None and good["available"] and good["vs_labels"]["device_accuracy"] > 0.9, good
    bad = broken.evaluation
    assert bad is not None and bad["available"]
    host = next(a for a in bundle.manifest.artifacts if a.file == "model.int8.onnx").verification
    assert host is not None  # the eval set sees the broken layer too: further from the float model than convert
    assert bad["vs_float"]["max_abs_error"] > 2 * host.max_abs_error, (bad, host)


def test_cli_check_eval(eval_bundle: ConvertResult, tiny_deploy_bundle: Path, tmp_path: Path) -> None:
    """`edgetk deploy --check --eval` through the option machinery; --eval on a bundle without an eval set is
    refused before any device is contacted (exit 2, one JSON document with --json)."""
    from tests.fixtures.cli import assert_clean_error, run_edgetk

    env = {"HOME": str(tmp_path), "EDGETK_STORE": str(tmp_path / "history.sqlite")}
    refused = run_edgetk("check", tiny_deploy_bundle, "--device", "local", "--eval", "--json", env=env)
    assert_clean_error(refused, 2, "carries no eval set", "--device-eval")
    assert "carries no eval set" in json.dumps(refused.json())
    done = run_edgetk("deploy", eval_bundle.bundle_dir, "--device", "local", "--check", "--eval", "--runs", "2",
                      "--baseline", "none", "--json", env=env)
    assert done.code in (0, 1), done.stderr  # 1: a gate of the profile (placement) may fail; not our business
    reports = done.json()["devices"][0]["reports"]
    assert len(reports) == 4 and all(r["evaluation"]["available"] for r in reports), reports
    assert all(r["evaluation"]["vs_labels"]["device_accuracy"] > 0.9 for r in reports)
