"""The on-device runner, run the way a device runs it: a separate python that has numpy and one runtime.

Nothing here imports the runner into the test process; every run is a subprocess of a device env's python
(tests/fixtures/device_envs.py) on a bundle built with the real converters (tests/fixtures/bundles.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.bundles import ARTIFACT_KINDS, copy_bundle, make_bundle
from tests.fixtures.device_envs import DeviceEnv
from toolkit import device_side
from toolkit.delivery.bundle import sha256_file
from toolkit.model.vocabulary import RunnerErrorKind
from tests.fixtures.runner_output import report_doc

RUNNER = device_side.source_path(device_side.RUNNER_FILE)
ENV_KEYS = (
    "arch",
    "os",
    "kernel",
    "device_model",
    "cpu_model",
    "cores",
    "cpu_freq_mhz",
    "governor",
    "temperature_c",
    "memory_mb",
    "free_disk_mb",
    "python",
    "glibc",
)
REPORT_KEYS = (
    "artifact",
    "runtime",
    "threads",
    "load_ms",
    "first_inference_ms",
    "latency_ms",
    "runs",
    "warmup",
    "peak_rss_mb",
    "outputs_match",
    "error",
)
ERROR_KINDS = RunnerErrorKind.values()


def test_the_runner_writes_the_error_kinds_the_host_reads() -> None:
    """The runner's ERROR_KINDS (it cannot import toolkit) and the host's RunnerErrorKind are the same words."""
    import ast

    tree = ast.parse(RUNNER.read_text())
    (written,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "ERROR_KINDS" for t in node.targets)]
    assert tuple(written) == ERROR_KINDS


def run_runner(
    python: Path | str,
    *args: str,
    runner: Path = RUNNER,
    extra_env: dict[str, str] | None = None,
    expect_rc: int = 0,
) -> dict[str, Any]:
    """Run the runner; its stdout must be exactly one JSON document (whatever the runtimes print): ``check``'s
    in its whole frame (docs/runner.md, "The frame"), the other commands' plain."""
    proc = subprocess.run(
        [str(python), str(runner), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **(extra_env or {})},
    )
    assert proc.returncode == expect_rc, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    if args[:1] == ("check",):
        doc = report_doc(proc.stdout)
    else:
        assert proc.stdout.count("\n") == 1, proc.stdout
        doc = json.loads(proc.stdout)
    assert "Traceback" not in proc.stdout, proc.stdout[proc.stdout.index("Traceback") - 200:][:3000]
    return doc


def check(env: DeviceEnv | Path, bundle: Path, *args: str, **kwargs: Any) -> dict[str, Any]:
    python = env.python if isinstance(env, DeviceEnv) else env
    return run_runner(python, "check", "--bundle", str(bundle), *args, **kwargs)


def reports(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["artifact"]: r for r in doc["reports"]}


def assert_measured(report: dict[str, Any], *, runtime: str, version: str, runs: int) -> None:
    assert set(REPORT_KEYS) <= set(report), report
    assert report["error"] is None, report["error"]
    assert report["runtime"]["name"] == runtime and report["runtime"]["version"] == version
    assert report["runs"] == runs
    lat = report["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert lat["min"] <= lat["mean"] <= lat["max"] and lat["std"] >= 0
    assert report["load_ms"] > 0 and report["first_inference_ms"] > 0
    assert 10 < report["peak_rss_mb"] < 2000
    match = report["outputs_match"]
    assert match["ok"] is True, match
    assert match["max_abs_error"] <= match["atol"] or match["top1_agreement"] == 1.0
    assert match["top1_agreement"] == 1.0
    assert match["samples"] == 16


def assert_error(report: dict[str, Any], kind: str, *needles: str) -> None:
    assert kind in ERROR_KINDS
    error = report["error"]
    assert error is not None and error["kind"] == kind, report
    text = f"{error['message']}\n{error['hint']}"
    for needle in needles:
        assert needle in text, (needle, error)
    assert report["latency_ms"] is None and report["outputs_match"] is None
    assert "Traceback" not in error["message"]


@pytest.fixture(scope="module")
def full_bundle(tmp_path_factory: pytest.TempPathFactory, digits_keras: Path, digits: Any) -> Path:
    """Every artifact kind: fp32/int8/dynamic/custom-op tflite and fp32 onnx."""
    return make_bundle(
        tmp_path_factory.mktemp("runner") / "full",
        keras_model=digits_keras,
        calibration=digits.x_calib,
        golden=digits.x_heldout[:16],
        artifacts=ARTIFACT_KINDS,
    )


# ------------------------------------------------------------------------------------------ static


def test_runner_source_is_python36_compatible() -> None:
    vermin = Path(sys.executable).parent / "vermin"
    # "3.6-": the runner may need at most 3.6 (vermin's plain "3.6" demands a minimum of exactly 3.6).
    proc = subprocess.run(
        [str(vermin), "--target=3.6-", "--no-tips", "--violations", str(RUNNER)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "requires" not in proc.stdout, proc.stdout
    source = RUNNER.read_text()
    assert "import toolkit" not in source and "from toolkit" not in source
    for banned in ("from __future__ import annotations", "capture_output", "dataclass", ":="):
        assert banned not in source, banned


# ------------------------------------------------------------------------------------------ probe


def test_probe_in_device_env(device_env: DeviceEnv) -> None:
    doc = run_runner(device_env.python, "probe")
    assert doc["runner_version"] == "2"
    env = doc["environment"]
    assert set(ENV_KEYS) <= set(env)
    assert env["arch"] == os.uname().machine and env["cores"] == os.cpu_count()
    assert env["python"].startswith("3.") and env["memory_mb"] > 100 and env["free_disk_mb"] > 0
    assert env["cpu_model"]
    assert doc["runtimes"] == {
        "litert": "2.3.0",
        "tflite-runtime": None,
        "tensorflow": None,
        "onnxruntime": "1.31.1",
        "executorch": None,
        "numpy": "2.4.6",
    }
    assert "CPUExecutionProvider" in doc["onnxruntime_providers"]


def test_probe_in_legacy_env(legacy_env: DeviceEnv) -> None:
    doc = run_runner(legacy_env.python, "probe")
    assert doc["runtimes"] == {
        "litert": None,
        "tflite-runtime": "2.14.0",
        "tensorflow": None,
        "onnxruntime": None,
        "executorch": None,
        "numpy": "1.26.4",
    }
    assert doc["onnxruntime_providers"] == []


def test_probe_needs_only_the_standard_library(empty_env: DeviceEnv) -> None:
    doc = run_runner(empty_env.python, "probe")
    assert set(doc["runtimes"].values()) == {None}
    assert set(ENV_KEYS) <= set(doc["environment"])


def test_device_env_holds_no_tensorflow_and_no_toolkit(device_env: DeviceEnv) -> None:
    for module in ("tensorflow", "keras", "toolkit", "torch"):
        proc = subprocess.run(
            [str(device_env.python), "-c", f"import {module}"],
            capture_output=True,
            text=True,
            cwd="/",
            check=False,
        )
        assert proc.returncode != 0, f"{module} is importable in the device env"


# ------------------------------------------------------------------------------------------ check


def test_check_tiny_bundle_in_device_env(device_env: DeviceEnv, tiny_bundle: Path) -> None:
    # The bundle's own copy of the runner, as deploy ships it.
    doc = check(
        device_env,
        tiny_bundle,
        "--runs",
        "30",
        "--warmup",
        "3",
        "--threads",
        "1",
        runner=tiny_bundle / "edgetk_runner.py",
    )
    assert doc["ok"] is True and doc["error"] is None
    assert set(ENV_KEYS) <= set(doc["environment"])
    by_file = reports(doc)
    assert list(by_file) == ["model.fp32.tflite", "model.int8.tflite", "model.fp32.onnx"]
    for name in ("model.fp32.tflite", "model.int8.tflite"):
        assert_measured(by_file[name], runtime="litert", version="2.3.0", runs=30)
    assert_measured(by_file["model.fp32.onnx"], runtime="onnxruntime", version="1.31.1", runs=30)
    assert by_file["model.fp32.onnx"]["runtime"]["providers"] == ["CPUExecutionProvider"]
    assert all(r["threads"] == 1 and r["warmup"] == 3 for r in doc["reports"])
    # fp32 runs the same kernels as on the host: the golden outputs come back (nearly) bit for bit.
    assert by_file["model.fp32.tflite"]["outputs_match"]["max_abs_error"] < 1e-5


def test_check_selected_artifact_and_min_time(device_env: DeviceEnv, tiny_bundle: Path) -> None:
    doc = check(
        device_env,
        tiny_bundle,
        "--artifact",
        "model.int8.tflite",
        "--runs",
        "5",
        "--warmup",
        "0",
        "--min-time",
        "0.3",
    )
    (report,) = doc["reports"]
    assert report["artifact"] == "model.int8.tflite" and report["error"] is None
    assert report["runs"] > 5  # kept going until 0.3 s had passed
    assert report["runs"] * report["latency_ms"]["mean"] >= 300 * 0.9


def test_legacy_pi_runs_fp32_int8_and_refuses_dynamic(legacy_env: DeviceEnv, full_bundle: Path) -> None:
    doc = check(legacy_env, full_bundle, "--runs", "10", "--warmup", "1")
    by_file = reports(doc)
    assert doc["ok"] is False and doc["error"] is None
    for name in ("model.fp32.tflite", "model.int8.tflite"):
        assert_measured(by_file[name], runtime="tflite-runtime", version="2.14.0", runs=10)
    assert_error(
        by_file["model.dynamic.tflite"],
        "unsupported_op",
        "FULLY_CONNECTED",
        "version 12",
        "tflite-runtime 2.14.0",
        "pip install ai-edge-litert",
    )
    assert_error(by_file["model.fp16.tflite"], "unsupported_op", "EdgetkTestOp")
    assert_error(by_file["model.fp32.onnx"], "missing_runtime", "pip install onnxruntime")


def test_custom_op_fails_alone_in_device_env(device_env: DeviceEnv, full_bundle: Path) -> None:
    doc = check(device_env, full_bundle, "--runs", "5", "--warmup", "1")
    by_file = reports(doc)
    assert_error(by_file["model.fp16.tflite"], "unsupported_op", "custom op EdgetkTestOp", "litert 2.3.0")
    for name in ("model.fp32.tflite", "model.int8.tflite", "model.dynamic.tflite", "model.fp32.onnx"):
        assert by_file[name]["error"] is None and by_file[name]["outputs_match"]["ok"], by_file[name]
    assert doc["ok"] is False


def test_missing_runtime(bare_env: DeviceEnv, tiny_bundle: Path) -> None:
    doc = check(bare_env, tiny_bundle, "--runs", "5")
    by_file = reports(doc)
    assert doc["ok"] is False and doc["error"] is None
    for name in ("model.fp32.tflite", "model.int8.tflite"):
        assert_error(by_file[name], "missing_runtime", "No runtime for .tflite", "pip install ai-edge-litert")
    assert_error(by_file["model.fp32.onnx"], "missing_runtime", "pip install onnxruntime")


def test_missing_numpy(empty_env: DeviceEnv, tiny_bundle: Path) -> None:
    doc = check(empty_env, tiny_bundle, "--artifact", "model.fp32.onnx")
    assert_error(doc["reports"][0], "missing_runtime", "numpy", "edgetk devices setup")


def _rewrite_manifest_hash(bundle: Path, file: str) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    for record in manifest["artifacts"]:
        if record["file"] == file:
            record["sha256"] = sha256_file(bundle / file)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_corrupt_artifacts(device_env: DeviceEnv, tiny_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_bundle(tiny_bundle, tmp_path / "corrupt")
    # Damaged on the device side after the manifest was written... and re-hashed, so only loading can tell.
    data = (bundle / "model.fp32.tflite").read_bytes()
    (bundle / "model.fp32.tflite").write_bytes(data[: len(data) // 3])
    (bundle / "model.fp32.onnx").write_bytes(b"\x08\x07garbage" * 100)
    for name in ("model.fp32.tflite", "model.fp32.onnx"):
        _rewrite_manifest_hash(bundle, name)
    doc = check(device_env, bundle, "--runs", "5")
    by_file = reports(doc)
    assert_error(by_file["model.fp32.tflite"], "corrupt_artifact", "litert", "edgetk deploy")
    assert_error(by_file["model.fp32.onnx"], "corrupt_artifact", "onnxruntime")
    assert (
        by_file["model.int8.tflite"]["error"] is None and by_file["model.int8.tflite"]["outputs_match"]["ok"]
    )


def test_tampered_artifact_is_not_measured(device_env: DeviceEnv, tiny_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_bundle(tiny_bundle, tmp_path / "tampered")
    data = bytearray((bundle / "model.int8.tflite").read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit: the file still loads, but it is not what convert wrote
    (bundle / "model.int8.tflite").write_bytes(bytes(data))
    doc = check(device_env, bundle, "--runs", "5")
    by_file = reports(doc)
    report = by_file["model.int8.tflite"]
    assert_error(report, "integrity", "sha256", "not measured")
    assert report["load_ms"] is None and report["first_inference_ms"] is None and report["runs"] == 0
    assert report["runtime"] == {"name": None, "version": None}
    assert by_file["model.fp32.tflite"]["error"] is None and by_file["model.fp32.onnx"]["error"] is None
    assert doc["ok"] is False


FAKE_ORT = """
import os, signal
__version__ = "0.0-crash"
def get_available_providers():
    return ["CPUExecutionProvider"]
class SessionOptions(object):
    pass
class InferenceSession(object):
    def __init__(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGSEGV)  # what a native kernel bug looks like from outside
"""


def test_crashing_runtime_is_reported_per_artifact(
    device_env: DeviceEnv, tiny_bundle: Path, tmp_path: Path
) -> None:
    # An onnxruntime whose session segfaults the process; the real litert still runs the tflite artifacts.
    fake = tmp_path / "fake_site" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_ORT)
    doc = check(device_env, tiny_bundle, "--runs", "5", extra_env={"PYTHONPATH": str(fake.parent)})
    by_file = reports(doc)
    assert_error(by_file["model.fp32.onnx"], "crash", "SIGSEGV", "model.fp32.onnx")
    for name in ("model.fp32.tflite", "model.int8.tflite"):
        assert by_file[name]["error"] is None and by_file[name]["outputs_match"]["ok"]
        assert by_file[name]["peak_rss_mb"] > 0
    assert doc["ok"] is False


FAKE_ORT_NO_MEMORY = """
import os, signal, sys
__version__ = "0.0-no-memory"
def get_available_providers():
    return ["CPUExecutionProvider"]
class SessionOptions(object):
    pass
class InferenceSession(object):
    def __init__(self, *args, **kwargs):
        if os.environ["FAKE_ORT_MODE"] == "raise":  # what onnxruntime raises when an allocation fails
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Exception during initialization: "
                               "std::bad_alloc")
        sys.stderr.write("terminate called after throwing an instance of 'std::bad_alloc'\\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGABRT)  # a native allocation failure nobody caught
"""


def test_an_allocation_failure_is_out_of_memory_not_a_damaged_file(device_env: DeviceEnv, tiny_bundle: Path,
                                                                   tmp_path: Path) -> None:
    """std::bad_alloc raised while the session loads, and one that aborts the worker, are ``out_of_memory`` (with
    the file's size, what the device has and what to try), never ``corrupt_artifact`` or a runtime ``crash``."""
    fake = tmp_path / "fake_site" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_ORT_NO_MEMORY)
    for mode, how in (("raise", "std::bad_alloc"), ("abort", "signal SIGABRT: bad_alloc")):
        doc = check(device_env, tiny_bundle, "--runs", "3", "--artifact", "model.fp32.onnx",
                    extra_env={"PYTHONPATH": str(fake.parent), "FAKE_ORT_MODE": mode})
        (report,) = doc["reports"]
        assert_error(report, "out_of_memory", "ran out of memory on the device", how, "MemAvailable",
                     "smaller artifact", "fewer threads")
        assert report["error"]["memory"]["file_bytes"] > 0 and report["error"]["memory"]["available_mb"] > 0


FAKE_EXECUTORCH = """
import os, signal, sys, time
with open(os.environ["FAKE_EXECUTORCH_LOG"], "a") as log:  # one line per process that imports the runtime
    log.write("%d\\n" % os.getpid())
class _Runtime(object):
    def load_program(self, path, **kwargs):
        with open(path, "rb") as handle:
            what = handle.read()
        if what == b"segv":
            os.kill(os.getpid(), signal.SIGSEGV)  # a kernel bug, from outside
        if what == b"hang":
            time.sleep(600)
        raise ValueError("Failed to load program: not a program")
class Runtime(object):
    @staticmethod
    def get():
        return _Runtime()
"""


def test_pte_artifacts_share_one_import_and_fail_apart(device_env: DeviceEnv, tiny_bundle: Path,
                                                        tmp_path: Path) -> None:
    """The .pte artifacts of a check share ONE import of their runtime (``run-group``: torch + executorch take
    6-10 s here, 43-55 s under qemu) and each is measured in a process forked after it: a segfault in the first
    and a hang past --timeout in the second are reported for those artifacts, and the third is still measured
    after them. The tflite/onnx artifacts keep a fresh process each (no ``worker``). A fake executorch (and an
    empty torch) stands in: a real runtime cannot be made to crash or hang on purpose; the real one is measured
    the same way in tests/executorch/test_pte_device.py and on the emulated Pi."""
    from toolkit.delivery.bundle import sha256_file

    bundle = copy_bundle(tiny_bundle, tmp_path / "pte")
    fake = tmp_path / "fake_site"
    (fake / "executorch").mkdir(parents=True)
    (fake / "executorch" / "__init__.py").write_text("")
    (fake / "executorch" / "runtime.py").write_text(FAKE_EXECUTORCH)
    (fake / "torch").mkdir()
    (fake / "torch" / "__init__.py").write_text("")
    manifest = json.loads((bundle / "manifest.json").read_text())
    names = ["model.segv.pte", "model.hang.pte", "model.junk.pte"]
    for name in names:
        (bundle / name).write_bytes(name.split(".")[1].encode())
        manifest["artifacts"].append({"file": name, "format": "pte", "precision": "fp32",
                                      "sha256": sha256_file(bundle / name), "inputs": [], "outputs": []})
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    log = tmp_path / "imports.log"
    doc = check(device_env, bundle, "--runs", "3", "--timeout", "10",
                extra_env={"PYTHONPATH": str(fake), "FAKE_EXECUTORCH_LOG": str(log)})
    found = reports(doc)
    assert len(log.read_text().split()) == 1, log.read_text()  # one import for the three .pte artifacts
    assert_error(found["model.segv.pte"], "crash", "SIGSEGV", "model.segv.pte")
    assert_error(found["model.hang.pte"], "crash", "did not finish within 10 s", "model.hang.pte")
    assert_error(found["model.junk.pte"], "corrupt_artifact", "not a program")
    for name in names:
        worker = found[name]["worker"]
        assert worker["process"] == "forked" and worker["artifacts"] == names and worker["import_ms"] > 0, worker
    for name in ("model.fp32.tflite", "model.int8.tflite", "model.fp32.onnx"):
        assert found[name]["error"] is None and found[name]["outputs_match"]["ok"], found[name]
        assert "worker" not in found[name]
    assert [r["artifact"] for r in doc["reports"]] == [a["file"] for a in manifest["artifacts"]]


def test_wrong_outputs_are_not_ok(device_env: DeviceEnv, tiny_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_bundle(tiny_bundle, tmp_path / "wrong")
    golden = bundle / "golden" / "model.fp32.tflite.npz"
    with np.load(golden) as data:
        outputs = {k: data[k] for k in data.files}
    outputs["output_0"] = outputs["output_0"][::-1].copy()  # samples shuffled: different classes
    np.savez(golden, **outputs)
    doc = check(device_env, bundle, "--artifact", "model.fp32.tflite", "--runs", "3")
    match = doc["reports"][0]["outputs_match"]
    assert match["ok"] is False and match["max_abs_error"] > 0.1 and match["top1_agreement"] < 0.9
    assert doc["ok"] is False and doc["reports"][0]["error"] is None


# ------------------------------------------------------------------------------------------ bad input


def test_usage_errors_are_json_with_exit_2(device_env: DeviceEnv, tiny_bundle: Path) -> None:
    for args in ([], ["check"], ["check", "--bundle", str(tiny_bundle), "--runs", "-3"], ["frobnicate"]):
        doc = run_runner(device_env.python, *args, expect_rc=2)
        assert doc["error"]["kind"] == "usage" and doc["error"]["hint"], args
    doc = check(device_env, tiny_bundle, "--artifact", "model.nope.tflite", expect_rc=2)
    assert doc["error"]["kind"] == "usage" and "model.fp32.tflite" in doc["error"]["message"]


def test_bad_bundle(device_env: DeviceEnv, tmp_path: Path) -> None:
    doc = check(device_env, tmp_path)
    assert doc["error"]["kind"] == "bad_bundle" and "manifest.json" in doc["error"]["message"]
    (tmp_path / "manifest.json").write_text("{not json")
    doc = check(device_env, tmp_path)
    assert doc["error"]["kind"] == "bad_bundle" and "not valid JSON" in doc["error"]["message"]
    assert doc["ok"] is False and doc["reports"] == []


def test_missing_artifact_file(device_env: DeviceEnv, tiny_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_bundle(tiny_bundle, tmp_path / "missing")
    (bundle / "model.fp32.onnx").unlink()
    doc = check(device_env, bundle, "--runs", "3")
    assert_error(reports(doc)["model.fp32.onnx"], "bad_bundle", "missing")


# ------------------------------------------------------------------------------------------ big / timing


def test_big_artifact_loads(device_env: DeviceEnv, big_bundle: Any) -> None:
    bundle = big_bundle(20)
    assert (bundle / "model.fp32.onnx").stat().st_size > 20 * 1024 * 1024
    doc = check(device_env, bundle, "--runs", "5")
    (report,) = doc["reports"]
    assert report["error"] is None and report["outputs_match"]["ok"], report
    assert report["peak_rss_mb"] > 20


def test_device_env_creation_time(device_env: DeviceEnv, legacy_env: DeviceEnv, bare_env: DeviceEnv) -> None:
    """Reported: how long the device envs took to create (None: reused from the cache)."""
    for env in (device_env, legacy_env, bare_env):
        marker = json.loads((env.root / ".complete").read_text())
        print(f"\n{env.name}: created in {marker['created_s']:.1f} s; this run: {env.created_s}")
        assert env.python.is_file() and os.access(env.python, os.X_OK)
        # Other users (the SSH tests' logins) must be able to run it: world r+x all the way down.
        for path in (env.root, env.root / "bin", env.root / "lib"):
            assert path.stat().st_mode & 0o005 == 0o005, path


def test_pipeline_bundle_checks_ok_on_device(
    device_env: DeviceEnv, digits_keras: Path, digits_calibration: Path, digits_eval: Path, tmp_path: Path
) -> None:
    """The contract end to end: a bundle written by `edgetk convert`'s pipeline passes the runner's check."""
    from toolkit.conversion.pipeline import ConvertOptions, convert_bundle

    result = convert_bundle(
        ConvertOptions(
            source=str(digits_keras),
            calibration=digits_calibration,
            eval_data=digits_eval,
            precisions=("fp32", "int8"),
            formats=("tflite",),
            out=tmp_path / "pipe",
        ),
        progress=lambda message: None,
    )
    doc = check(device_env, result.bundle_dir, "--runs", "10", runner=result.bundle_dir / "edgetk_runner.py")
    assert doc["ok"] is True, doc["reports"]
    assert {r["artifact"] for r in doc["reports"]} == {a.file for a in result.manifest.artifacts}
    for report in doc["reports"]:
        assert report["outputs_match"]["ok"] and report["outputs_match"]["top1_agreement"] == 1.0
