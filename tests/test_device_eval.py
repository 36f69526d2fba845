"""The device proves accuracy (check --eval) and names the first diverging layer when its outputs differ.

Real parts only: the trained digits CNN converted by the real pipeline with ``--device-eval`` (the shared
``digits_bundle``; ``eval_bundle`` keeps its fp32 + INT8 artifacts, TFLite and ONNX), deployed to the ``local``
device and to a loopback OpenSSH device, run by the bundle's own runner. The broken artifacts are real INT8
artifacts whose second convolution's weight scale was multiplied by three (and the manifest re-hashed, as a
faulty re-quantization would ship them, the ONNX copy with the layers exposed included).

The eval set and the layer probes are verified by sha256 where they are read: a file changed on the device
after the host pushed it is refused there, one changed in the bundle is refused on the host before any device
is contacted, and a bundle whose manifest predates their record (schema 2) does not use them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.bundles import copy_bundle, subset_bundle
from tests.test_gates_device import local  # noqa: F401 - the `local` device fixture (a private HOME)
from tests.fixtures.home import Home
from toolkit.conversion.onnx import artifact as onnx_artifact
from toolkit.delivery.bundle import debug_name, probe_name, read_bundle, sha256_file
from toolkit.checks.checking import GateOptions, check
from toolkit.delivery.deployment import Device, version_dir
from toolkit.delivery.push import push
from toolkit.devices.spec import DeviceSpec, parse_spec
from toolkit.reporting.html import collect, render_html
from toolkit.reporting.terminal import bundle_table
from toolkit.store import Store

BROKEN_ONNX_LAYER = "digits_1/conv2d_1_2/BiasAdd"  # the second Conv node of the INT8 ONNX
BROKEN_TFLITE_LAYER = ("digits_1/conv2d_1_2/Relu;digits_1/conv2d_1_2/BiasAdd;digits_1/conv2d_1_2/convolution;"
                       "digits_1/conv2d_1_2/Squeeze1")


def _rehash(bundle_dir: Path, name: str) -> None:
    """Record ``name``'s new sha256 and size in the manifest (an artifact or an on-demand file)."""
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    for record in [*manifest["artifacts"], *manifest["on_demand"]]:
        if record["file"] == name:
            record["sha256"] = sha256_file(bundle_dir / name)
            record["bytes"] = (bundle_dir / name).stat().st_size
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
    probe = json.loads((bundle_dir / probe_name(path.name)).read_text())
    onnx_artifact.with_outputs(path, [layer["tensor"] for layer in probe["layers"]],
                            bundle_dir / debug_name(path.name))
    _rehash(bundle_dir, debug_name(path.name))


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


def test_eval_set_runs_on_the_device_and_matches_the_host(eval_bundle: Path, local: Device,
                                                          tmp_path: Path) -> None:
    bundle = read_bundle(eval_bundle)
    assert not any(f.path.startswith("eval/") or f.path.startswith("layers/") for f in bundle.files())  # deploy stays small
    # ... but the manifest records every file of eval/ and layers/ with its sha256 and size
    written = {p.relative_to(eval_bundle).as_posix(): p for d in ("eval", "layers")
               for p in (eval_bundle / d).rglob("*") if p.is_file()}
    assert {"eval/input_0.npy", "eval/reference.npz", "eval/labels.npy", "layers/model.int8.onnx.probe.json",
            "layers/model.int8.onnx.float.npz", "layers/model.int8.onnx.debug.onnx",
            "layers/model.int8.tflite.probe.json"} <= set(written)
    assert {f.file: (f.sha256, f.bytes) for f in bundle.manifest.on_demand} == {
        name: (sha256_file(path), path.stat().st_size) for name, path in written.items()}
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
        assert result["failures"] == [] and report.gates.passed, (result["failures"], report.gates.failures)
        assert report.to_dict()["evaluation"] == result
    # side by side in the terminal table and in the HTML report read back from the history
    text = bundle_table(bundle.manifest, reports)
    assert "the eval set on the device (--eval):" in text
    assert "eval set on the device (497 samples" in text and "vs the float model" in text, text
    page = render_html(collect(eval_bundle, store=tmp_path / "history.sqlite"))
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


def test_eval_without_labels_reports_float_agreement_only(eval_bundle: Path, local: Device,
                                                          tmp_path: Path) -> None:
    bundle_dir = subset_bundle(eval_bundle, tmp_path / "nolabels", ("model.int8.tflite",))
    (bundle_dir / "eval" / "labels.npy").unlink()  # as converted from eval data without labels
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    manifest["on_demand"] = [f for f in manifest["on_demand"] if f["file"] != "eval/labels.npy"]
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    bundle = read_bundle(bundle_dir)
    push(local, bundle)
    (report,) = check(local, bundle, runs=2, warmup=0, gates=GateOptions(baseline="none"), evaluate=True)
    result = report.evaluation
    assert result is not None and result["available"] and result["labels"] is False
    assert result["vs_labels"] is None and "no labels" in result["note"]
    host = bundle.manifest.artifact("model.int8.tflite").verification
    assert host is not None and result["vs_float"]["top1_agreement"] == pytest.approx(host.top1_agreement, abs=1e-9)


def test_broken_layer_is_named_and_the_lost_accuracy_fails_on_local(eval_bundle: Path, local: Device,
                                                                      tmp_path: Path) -> None:
    bundle_dir = copy_bundle(eval_bundle, tmp_path / "broken")
    _break_onnx(bundle_dir)
    _break_tflite(bundle_dir)
    bundle = read_bundle(bundle_dir)
    push(local, bundle)
    reports = {r.artifact: r for r in check(local, bundle, runs=2, warmup=0, gates=GateOptions(baseline="none"),
                                            evaluate=True)}
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
        # the eval set scored on the device: the outputs differ from the golden ones, yet the task holds (0.972
        # vs the float model's 0.974 measured): the eval gate judges the task, it does not fail this artifact
        evaluation = report.evaluation
        assert evaluation is not None and evaluation["available"] and evaluation["failures"] == [], evaluation
        assert not [f for f in report.gates.failures if "on the eval set" in f]
    for artifact in ("model.fp32.onnx", "model.fp32.tflite"):
        assert reports[artifact].gates.passed, reports[artifact].gates.failures
        assert "divergence" not in reports[artifact].gates.details


def test_accuracy_lost_on_the_device_fails_the_check(eval_bundle: Path, local: Device, tmp_path: Path) -> None:
    """An INT8 TFLite whose classifier weights' scale shrank 100-fold (a faulty re-quantization after convert):
    the device's eval set breaks the tolerance the host's artifact met, and the check fails naming the metric."""
    from ai_edge_litert.tools import flatbuffer_utils

    bundle_dir = subset_bundle(eval_bundle, tmp_path / "collapsed", ("model.int8.tflite",))
    path = bundle_dir / "model.int8.tflite"
    model = flatbuffer_utils.read_model(str(path))
    graph = model.subgraphs[0]
    fully_connected = [o for o in graph.operators if model.operatorCodes[o.opcodeIndex].builtinCode == 9]
    weights = graph.tensors[fully_connected[-1].inputs[1]]
    weights.quantization.scale = [s * 0.01 for s in weights.quantization.scale]
    flatbuffer_utils.write_model(model, str(path))
    _rehash(bundle_dir, "model.int8.tflite")
    bundle = read_bundle(bundle_dir)
    push(local, bundle)
    (report,) = check(local, bundle, runs=2, warmup=0, gates=GateOptions(baseline="none"), evaluate=True)
    evaluation = report.evaluation
    assert evaluation is not None and evaluation["available"] and evaluation["failures"], evaluation
    (lost,) = [f for f in report.gates.failures if "on the eval set" in f]
    assert lost.startswith("model.int8.tflite: on the eval set on local (497 samples): "), lost
    assert "top-1 accuracy" in lost and "vs float" in lost, lost
    assert not report.gates.passed
    print(f"\n{lost}")


@contextmanager
def _ssh_device(ssh_devices, ssh_client_key, device_python: str,
                tmp_path: Path) -> Iterator[Device]:
    """The first loopback OpenSSH device, connected (its host key known, nothing else trusted)."""
    from toolkit.devices import open_connection

    (dev,) = ssh_devices(1)
    base = parse_spec(dev.spec)
    spec = DeviceSpec(name=dev.name, host=base.host, port=base.port, user=base.user,
                      identity_file=str(ssh_client_key), python=device_python)
    known = tmp_path / "known_hosts"
    known.write_text(dev.known_hosts_line())
    with open_connection(spec, known_hosts=str(known)) as conn:
        yield Device(spec, conn)


@pytest.mark.ssh
def test_eval_and_divergence_over_ssh(eval_bundle: Path, ssh_devices, ssh_client_key,
                                      device_python: str, tmp_path: Path) -> None:
    bundle_dir = subset_bundle(eval_bundle, tmp_path / "broken", ("model.int8.tflite", "model.int8.onnx"))
    _break_onnx(bundle_dir)
    bundle = read_bundle(bundle_dir)
    with _ssh_device(ssh_devices, ssh_client_key, device_python, tmp_path) as device:
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


@pytest.mark.ssh
def test_eval_input_and_layer_probe_changed_on_the_device_are_refused_there(
        eval_bundle: Path, ssh_devices, ssh_client_key, device_python: str, tmp_path: Path) -> None:
    """Files changed on the device after the host pushed them (a bad card, another hand) are refused by the
    device's runner against its manifest, in plain words; the check fails; removing them (the hint) lets the
    next check push the bundle's copy again."""
    bundle_dir = subset_bundle(eval_bundle, tmp_path / "one", ("model.int8.onnx",))
    _break_onnx(bundle_dir)  # its outputs differ: the check asks the device for the layers too
    bundle = read_bundle(bundle_dir)
    vdir = version_dir(bundle.name, bundle.version)
    changed = ("eval/input_0.npy", debug_name("model.int8.onnx"))
    with _ssh_device(ssh_devices, ssh_client_key, device_python, tmp_path) as device:
        push(device, bundle)
        for name in changed:
            data = bytearray((bundle_dir / name).read_bytes())
            data[-1] ^= 0x01  # one bit: still a loadable file
            (tmp_path / "changed").write_bytes(bytes(data))
            assert device.conn.run(["mkdir", "-p", f"{vdir}/{Path(name).parent}"]).ok
            device.conn.put(tmp_path / "changed", f"{vdir}/{name}")
        (report,) = check(device, bundle, runs=1, warmup=0, gates=GateOptions(baseline="none"), evaluate=True)
        for name in changed:
            assert device.conn.run(["rm", "-f", f"{vdir}/{name}"]).ok
        (again,) = check(device, bundle, runs=1, warmup=0, gates=GateOptions(baseline="none"), evaluate=True)
    evaluation = report.evaluation
    assert evaluation is not None and evaluation["available"] is False and evaluation["refused"] is True
    assert evaluation["note"].startswith("the device refused the eval set: eval/input_0.npy does not match its "
                                         "sha256 in manifest.json"), evaluation
    assert "Remove the file on the device" in evaluation["note"]
    assert not report.gates.passed
    assert any(f.startswith(f"model.int8.onnx: eval set refused on {report.device}: the device refused the eval "
                            "set: eval/input_0.npy") for f in report.gates.failures), report.gates.failures
    found = report.gates.details["divergence"]
    assert found["available"] is False
    assert found["note"].startswith("the device refused the layer probe: layers/model.int8.onnx.debug.onnx does not "
                                    "match its sha256 in manifest.json"), found
    # pushed again from the bundle's (verified) copy: the eval set runs, the layer is named
    assert again.evaluation is not None and again.evaluation["available"], again.evaluation
    assert again.evaluation["vs_labels"]["float_accuracy"] > 0.9
    assert again.gates.details["divergence"]["first"]["layer"] == BROKEN_ONNX_LAYER
    assert not any("eval set refused" in f for f in again.gates.failures)


def test_cli_check_eval(eval_bundle: Path, tiny_deploy_bundle: Path, tmp_path: Path) -> None:
    """`edgetk deploy --check --eval` through the option machinery; --eval on a bundle without an eval set is
    refused before any device is contacted (exit 2, one JSON document with --json)."""
    from tests.fixtures.cli import assert_clean_error, run_edgetk, run_edgetk_inproc

    env = Home(tmp_path).env
    refused = run_edgetk_inproc("check", tiny_deploy_bundle, "--device", "local", "--eval", "--json", env=env)
    assert_clean_error(refused, 2, "carries no eval set", "--device-eval")
    assert "carries no eval set" in json.dumps(refused.json())
    # an eval file changed in the bundle after conversion: refused on the host, before any device is contacted
    changed = copy_bundle(eval_bundle, tmp_path / "changed")
    np.save(changed / "eval" / "labels.npy", np.zeros(497, dtype=np.int64))
    refused = run_edgetk_inproc("check", changed, "--device", "local", "--eval", env=env)
    assert_clean_error(refused, 2, "eval/labels.npy", "does not match its sha256 in manifest.json", "edgetk convert")
    # a bundle whose manifest predates the record (schema 2, no on_demand): its eval set is not used
    old = copy_bundle(eval_bundle, tmp_path / "old")
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["schema_version"] = 2
    del manifest["on_demand"]
    (old / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    refused = run_edgetk_inproc("check", old, "--device", "local", "--eval", env=env)
    assert_clean_error(refused, 2, "eval set", "older edgetk", "Convert the bundle again")
    done = run_edgetk("deploy", eval_bundle, "--device", "local", "--check", "--eval", "--runs", "2",
                      "--baseline", "none", "--json", env=env)
    assert done.code in (0, 1), done.stderr  # 1: a gate of the profile (placement) may fail; not our business
    reports = done.json()["devices"][0]["reports"]
    assert len(reports) == 4 and all(r["evaluation"]["available"] for r in reports), reports
    assert all(r["evaluation"]["vs_labels"]["device_accuracy"] > 0.9 for r in reports)


def test_device_outputs_are_scored_by_the_roles_declared_at_convert_time(eval_bundle: Path) -> None:
    """check --eval scores the device's outputs with the task and per-output roles convert used: a role the user
    declared (``--output-task``) is kept, not re-inferred from the outputs; without one the role is inferred as
    at convert time. The device's outputs here are the host INT8 TFLite's own, on the bundle's eval set."""
    from dataclasses import replace

    from toolkit.checks import device_eval
    from toolkit.delivery.bundle import load_npz
    from toolkit.runtimes.execution import open_session

    bundle = read_bundle(eval_bundle)
    record = bundle.manifest.artifact("model.int8.tflite")
    assert record.verification is not None and record.verification.outputs
    reference = load_npz(eval_bundle / device_eval.EVAL_REFERENCE)
    inputs = [np.load(eval_bundle / name) for name in device_eval.input_files(bundle)]
    session = open_session(eval_bundle / record.file)
    names = [spec.name for spec in session.inputs]
    outputs = [session.run({names[0]: x}) for x in inputs[0]]  # stacked as [N, *input shape]
    device_outputs = [np.stack([o[k] for o in outputs]) for k in range(len(outputs[0]))]

    inferred = device_eval.score(record, reference, device_outputs, None)
    assert inferred.outputs[0].role == record.verification.outputs[0].role == "classification"
    output = record.verification.outputs[0]
    declared = replace(record, verification=replace(
        record.verification, outputs=(replace(output, role="embedding", role_source="--output-task"),)))
    scored = device_eval.score(declared, reference, device_outputs, None)
    assert scored.outputs[0].role == "embedding" and scored.outputs[0].role_source == "--output-task"
    assert "cosine" in json.dumps(scored.outputs[0].metrics)


def test_outputs_a_metric_judged_on_the_host_are_not_gated_on_the_device(eval_bundle: Path, tmp_path: Path) -> None:
    """A device whose outputs are a broken INT8's (second convolution's weight scales tripled) fails the tensor
    limits; when a --metric judged that output at convert time, those limits are not the bundle's and the device
    check does not apply them (the metric is not re-run there)."""
    from dataclasses import replace

    from toolkit.checks import device_eval
    from toolkit.delivery.bundle import load_npz
    from toolkit.runtimes.execution import open_session

    broken_dir = copy_bundle(eval_bundle, tmp_path / "broken")
    _break_tflite(broken_dir)
    bundle = read_bundle(broken_dir)
    record = read_bundle(eval_bundle).manifest.artifact("model.int8.tflite")
    assert record.verification is not None
    reference = load_npz(eval_bundle / device_eval.EVAL_REFERENCE)
    inputs = np.load(eval_bundle / device_eval.input_files(bundle)[0])
    session = open_session(broken_dir / record.file)
    name = session.inputs[0].name
    outputs = [session.run({name: x}) for x in inputs]
    device_outputs = [np.stack([o[k] for o in outputs]) for k in range(len(outputs[0]))]
    scored = device_eval.score(record, reference, device_outputs, None)
    assert device_eval.lost_on_device(record, scored, bundle)  # the tensor limits catch the broken layer
    judged = replace(record, verification=replace(record.verification, user_metric={
        "metric": "metric.py:fn", "values": {}, "ok": True, "covers": [o.name for o in record.verification.outputs]}))
    assert device_eval.lost_on_device(judged, scored, bundle) == []
