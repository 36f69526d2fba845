"""Inside a run on the device: placement, per-operator profiles, accelerators, throughput and loads (runner side).

Every run is the real runner in a device env's python (numpy + ai-edge-litert + onnxruntime, or the legacy
numpy 1.26 + tflite-runtime 2.14) on bundles built here with the real converters. What cannot exist on this
machine is said where it matters: there is no Coral (the Edge TPU artifact is a real TFLite file whose first op
is the ``edgetpu-custom-op`` a compiler would write; only the missing-runtime path can run), and the ONNX Runtime
wheel is the CPU-only one (an artifact pinned to CUDA must be reported as fallen back; the GPU path itself
cannot run here). Only orderings and hang bounds are asserted about time, never durations.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.bundles import _onnx_bytes, _tflite_bytes, with_custom_op, write_bundle
from tests.fixtures.device_envs import DeviceEnv
from tests.runner.test_runner import check, reports
from toolkit import device_side

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "background_load.py"


def _quantize_onnx(fp32: bytes, calibration: np.ndarray, directory: Path) -> bytes:
    """Static QDQ INT8 (U8S8, per channel) with onnxruntime.quantization on real calibration samples."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    source = directory / "fp32.onnx"
    source.write_bytes(fp32)
    import onnxruntime as ort

    name = ort.InferenceSession(fp32, providers=["CPUExecutionProvider"]).get_inputs()[0].name

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{name: calibration[i : i + 1].astype(np.float32)} for i in range(64)])

        def get_next(self) -> Any:
            return next(self.items, None)

    target = directory / "int8.onnx"
    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
    return target.read_bytes()


@pytest.fixture(scope="module")
def inside_bundle(tmp_path_factory: pytest.TempPathFactory, digits_keras: Path, digits: Any) -> Path:
    """The trained digits CNN as TFLite fp32/int8 and ONNX fp32/int8, the ONNX ones with a dynamic batch."""
    import keras

    model = keras.models.load_model(digits_keras)
    shape = tuple(model.inputs[0].shape[1:])
    work = tmp_path_factory.mktemp("inside")
    calib = digits.x_calib.astype(np.float32).reshape(-1, *shape)
    onnx_fp32 = _onnx_bytes(model, (None, *shape))
    files = [
        ("model.fp32.tflite", _tflite_bytes(model, "tflite-fp32", calib)),
        ("model.int8.tflite", _tflite_bytes(model, "tflite-int8", calib)),
        ("model.fp32.onnx", onnx_fp32),
        ("model.int8.onnx", _quantize_onnx(onnx_fp32, calib, work)),
    ]
    golden = [digits.x_heldout[:8].astype(np.float32).reshape(8, 1, *shape)]
    return write_bundle(work / "bundle", files=files, golden_inputs=golden, name="inside")


def _partial_tflite() -> bytes:
    """Dense -> CumSum -> Dense: XNNPACK takes both Dense layers and leaves CUMSUM on the CPU kernels.
    (Random weights: this model is about where operators run, nothing is claimed about its outputs.)"""
    import tensorflow as tf

    inp = tf.keras.Input((8,), batch_size=1)
    x = tf.keras.layers.Dense(16, activation="relu")(inp)
    x = tf.keras.layers.Lambda(lambda t: tf.math.cumsum(t, axis=-1))(x)
    out = tf.keras.layers.Dense(4)(x)
    return bytes(tf.lite.TFLiteConverter.from_keras_model(tf.keras.Model(inp, out)).convert())


def _small_onnx() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"), helper.make_node("Relu", ["h"], ["y"])],
        "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[numpy_helper.from_array(weights, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def partial_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A partially delegated TFLite model, an ONNX model pinned to CUDA (absent here) and an Edge TPU artifact."""
    partial = _partial_tflite()
    x = np.random.default_rng(1).standard_normal((4, 1, 8)).astype(np.float32)
    bundle = write_bundle(
        tmp_path_factory.mktemp("partial") / "bundle",
        files=[("model.fp32.tflite", partial), ("model.fp32.onnx", _small_onnx()),
               ("model.int8.tflite", with_custom_op(partial, "edgetpu-custom-op"))],
        golden_inputs=[x], name="partial", execution_providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
    )
    # What the Edge TPU step of convert names its output; the manifest says which delegate it needs.
    (bundle / "model.int8.tflite").rename(bundle / "model.int8_edgetpu.tflite")
    manifest = json.loads((bundle / "manifest.json").read_text())
    for record in manifest["artifacts"]:
        if record["file"] == "model.int8.tflite":
            record["file"] = "model.int8_edgetpu.tflite"
            record["delegate"] = "libedgetpu.so.1"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


# ------------------------------------------------------------------------------------------ profiles


def test_profiles_fp32_and_int8_in_litert_and_onnxruntime(device_env: DeviceEnv, inside_bundle: Path) -> None:
    doc = check(device_env, inside_bundle, "--runs", "20", "--warmup", "2", "--profile", "--profile-top", "5",
                "--profile-runs", "10")
    by_file = reports(doc)
    assert doc["ok"] is True, doc["reports"]
    for name in ("model.fp32.onnx", "model.int8.onnx"):
        report = by_file[name]
        profile, placement = report["profile"], report["placement"]
        assert profile["available"] is True and profile["runs"] == 10
        types = {t["op_type"]: t for t in profile["by_op_type"]}
        assert "Conv" in types or "QLinearConv" in types, types
        assert sum(t["share"] for t in profile["by_op_type"]) == pytest.approx(1.0, abs=0.01)
        assert all(t["time_ms"] >= 0 and t["on"] == {"CPUExecutionProvider": t["nodes"]} for t in types.values())
        assert 0 < len(profile["top_nodes"]) <= 5
        times = [n["time_ms"] for n in profile["top_nodes"]]
        assert times == sorted(times, reverse=True)
        # The latency percentiles are the unprofiled runs'; the profiled session is measured beside them.
        assert profile["overhead"]["unprofiled_mean_ms"] == pytest.approx(report["latency_ms"]["mean"], rel=1e-3)
        assert profile["overhead"]["profiled_mean_ms"] > 0 and profile["overhead"]["ratio"] > 0
        assert placement["intended"] == "CPUExecutionProvider" and placement["source"] == "profile"
        assert placement["nodes_total"] == sum(t["nodes"] for t in types.values())
        assert placement["nodes_on_intended"] == placement["nodes_total"] and placement["fallback_ops"] == []
        assert placement["time_share_on_intended"] == 1.0
    int8_types = {t["op_type"] for t in by_file["model.int8.onnx"]["profile"]["by_op_type"]}
    assert int8_types & {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "ConvInteger"}, int8_types
    for name in ("model.fp32.tflite", "model.int8.tflite"):
        report = by_file[name]
        profile, placement = report["profile"], report["placement"]
        # LiteRT 2.3's Python interpreter has no op profiler: said plainly, with the graph after delegation.
        assert profile["available"] is False and "no per-operator timer" in profile["note"]
        assert "litert 2.3.0" in profile["note"]
        types = {t["op_type"]: t for t in profile["by_op_type"]}
        assert "CONV_2D" in types and all(t["time_ms"] is None for t in types.values())
        assert placement["intended"] == "XNNPACK" and placement["source"] == "graph"
        assert placement["nodes_total"] == sum(t["nodes"] for t in types.values()) > 3
        assert placement["time_share_on_intended"] is None
        assert placement["nodes_on_intended"] + sum(
            t["on"].get("cpu", 0) for t in types.values()) == placement["nodes_total"]
    # XNNPACK takes the convolutions and dense layers; the batch-size arithmetic of the dynamic-batch reshape
    # (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE) stays on the CPU kernels: a real, harmless partial delegation.
    fp32 = {t["op_type"]: t["on"] for t in by_file["model.fp32.tflite"]["profile"]["by_op_type"]}
    assert fp32["CONV_2D"] == {"XNNPACK": 2} and fp32["FULLY_CONNECTED"] == {"XNNPACK": 2}
    assert set(by_file["model.fp32.tflite"]["placement"]["fallback_ops"]) <= {"SHAPE", "STRIDED_SLICE", "PACK",
                                                                             "RESHAPE"}


def test_partial_delegation_and_absent_provider_are_reported_as_fallback(
    device_env: DeviceEnv, partial_bundle: Path
) -> None:
    doc = check(device_env, partial_bundle, "--runs", "5", "--warmup", "1",
                "--artifact", "model.fp32.tflite", "--artifact", "model.fp32.onnx")
    by_file = reports(doc)
    tflite = by_file["model.fp32.tflite"]["placement"]
    assert (tflite["intended"], tflite["nodes_total"], tflite["nodes_on_intended"]) == ("XNNPACK", 3, 2)
    assert tflite["fallback_ops"] == ["CUMSUM"] and tflite["fell_back"] is True
    # The GPU path cannot run here (CPU-only onnxruntime wheel): the artifact pinned to CUDA falls back whole.
    onnx = by_file["model.fp32.onnx"]
    assert onnx["runtime"]["providers_missing"] == ["CUDAExecutionProvider"]
    placement = onnx["placement"]
    assert placement["intended"] == "CUDAExecutionProvider" and placement["nodes_on_intended"] == 0
    assert placement["nodes_total"] == 2 and placement["fallback_ops"] == ["MatMul", "Relu"]
    assert placement["fell_back"] is True and placement["time_share_on_intended"] == 0.0
    assert "CUDAExecutionProvider" in placement["note"]
    assert onnx["outputs_match"]["ok"] is True  # it ran correctly on the CPU: fallen back is not a crash...
    assert doc["ok"] is False  # ...and not a pass either
    # ...and the host's placement gate fails both, naming what fell back
    from toolkit.checks.gates.placement import judge_placement
    from toolkit.model.runner_report import parse_runner_output
    from toolkit.model.policy import PlacementExpectation

    parsed = {r.artifact: r for r in parse_runner_output(json.dumps(doc), device="here",
                                                         artifacts=list(by_file))}
    failure, _, _ = judge_placement(parsed["model.fp32.tflite"], PlacementExpectation(format="tflite", on="xnnpack"))
    assert failure and "2 of 3 nodes" in failure and "CUMSUM" in failure
    failure, _, _ = judge_placement(parsed["model.fp32.onnx"],
                                    PlacementExpectation(format="onnx", on="CUDAExecutionProvider", min_nodes_pct=50))
    assert failure and "0 of 2 nodes" in failure and "not available" in failure


def test_edgetpu_artifact_without_the_runtime_is_missing_runtime(device_env: DeviceEnv, partial_bundle: Path) -> None:
    """No Coral and no libedgetpu here: only the refusal path runs; the CPU artifacts are still measured."""
    doc = check(device_env, partial_bundle, "--runs", "5", "--warmup", "1")
    by_file = reports(doc)
    error = by_file["model.int8_edgetpu.tflite"]["error"]
    assert error["kind"] == "missing_runtime", error
    assert "libedgetpu.so.1" in error["message"] and "libedgetpu1-std" in error["hint"]
    assert "coral.ai" in error["hint"]
    assert by_file["model.fp32.tflite"]["error"] is None and by_file["model.fp32.tflite"]["latency_ms"]["p50"] > 0
    assert by_file["model.fp32.onnx"]["error"] is None


def test_legacy_tflite_runtime_reports_placement_and_says_it_cannot_time_ops(
    legacy_env: DeviceEnv, partial_bundle: Path
) -> None:
    doc = check(legacy_env, partial_bundle, "--runs", "5", "--warmup", "1", "--profile",
                "--artifact", "model.fp32.tflite")
    (report,) = doc["reports"]
    assert report["error"] is None and report["runtime"] == {"name": "tflite-runtime", "version": "2.14.0"}
    placement = report["placement"]
    assert (placement["nodes_total"], placement["nodes_on_intended"], placement["fallback_ops"]) == (3, 2, ["CUMSUM"])
    assert report["profile"]["available"] is False and "tflite-runtime 2.14.0" in report["profile"]["note"]


# ------------------------------------------------------------------------------------------ throughput


def test_throughput_at_batch_1_4_8_with_outputs_equal_per_sample(device_env: DeviceEnv, inside_bundle: Path) -> None:
    doc = check(device_env, inside_bundle, "--runs", "16", "--warmup", "1", "--throughput", "--batch-sizes", "1,4,8",
                "--in-flight", "1,2")
    by_file = reports(doc)
    assert doc["ok"] is True, doc["reports"]
    onnx = by_file["model.fp32.onnx"]["throughput"]  # exported with a dynamic batch dimension
    assert onnx["mode"] == "batch" and [p["batch"] for p in onnx["points"]] == [1, 4, 8]
    assert all(p["inferences_per_s"] > 0 and p["latency_ms"]["p50"] > 0 for p in onnx["points"])
    checks = onnx["per_sample"]["checks"]
    assert [c["batch"] for c in checks] == [1, 4, 8] and onnx["per_sample"]["ok"] is True
    assert all(c["max_abs_error"] <= 1e-4 for c in checks), checks
    int8 = by_file["model.int8.onnx"]["throughput"]
    assert int8["mode"] == "batch" and int8["per_sample"]["ok"] is True
    for name in ("model.fp32.tflite", "model.int8.tflite"):
        curve = by_file[name]["throughput"]
        assert curve["mode"] in ("batch", "in_flight"), curve
        if curve["mode"] == "in_flight":
            assert [p["in_flight"] for p in curve["points"]] == [1, 2] and curve["per_sample"] is None
        else:
            assert curve["per_sample"]["ok"] is True
        assert all(p["inferences_per_s"] > 0 for p in curve["points"])


# ------------------------------------------------------------------------------------------ loads


def test_cold_warm_and_optimized_loads(device_env: DeviceEnv, inside_bundle: Path) -> None:
    doc = check(device_env, inside_bundle, "--runs", "5", "--warmup", "1", "--loads",
                "--artifact", "model.fp32.onnx", "--artifact", "model.int8.tflite")
    by_file = reports(doc)
    for name, option in (("model.fp32.onnx", "ort_optimized_model"), ("model.int8.tflite", "xnnpack_weight_cache")):
        loads = by_file[name]["loads"]
        cold, warm = loads["cold"], loads["warm"]
        assert cold["error"] is None and warm["error"] is None
        for entry in (cold, warm):
            assert entry["load_ms"] > 0 and entry["first_inference_ms"] > 0
        cache = cold["page_cache"]
        if cache["dropped"]:
            # the drop really emptied the cache, and the warm load found the file cached again
            assert cache["resident_after"] <= 0.05 and warm["resident_before_load"] >= 0.95
        else:
            assert cache["note"], cache  # the device's inability to drop the cache is said, never silent
        (entry,) = [o for o in loads["options"] if o["name"] == option]
        assert entry["before"]["error"] is None and entry["after"]["error"] is None
        assert entry["after"]["load_ms"] > 0 and entry["after"]["first_inference_ms"] > 0
    ort = [o for o in by_file["model.fp32.onnx"]["loads"]["options"] if o["name"] == "ort_optimized_model"][0]
    assert ort["after"]["max_abs_diff_vs_original"] <= 1e-5
    xnn = [o for o in by_file["model.int8.tflite"]["loads"]["options"] if o["name"] == "xnnpack_weight_cache"][0]
    assert xnn["prepare"]["cache_bytes"] > 0 and xnn["after"]["cache_bytes"] == xnn["prepare"]["cache_bytes"]
    # ONNX Runtime session options, each against the default session in interleaved rounds of fresh processes:
    # load, first inference and peak RSS reported per side (median and range), for the host to judge
    from toolkit.reporting.load_advice import paying_options

    options = {o["name"]: o for o in by_file["model.fp32.onnx"]["loads"]["options"]}
    tunings = ("session.use_env_allocators", "enable_cpu_mem_arena=False",
               "session.use_device_allocator_for_initializers", "session.disable_prepacking")
    for name in tunings:
        for side in ("before", "after"):
            entry = options[name][side]
            assert entry.get("error") is None and entry["rounds"] == 3, (name, entry)
            for key in ("load_ms", "first_inference_ms", "peak_rss_mb"):
                low, high = entry[f"{key}_range"]
                assert 0 < low <= entry[key] <= high, (name, side, key, entry)
    assert all(a.option in tunings for a in paying_options(by_file["model.fp32.onnx"]["loads"]))


def test_background_load_example_runs_on_the_device_env(device_env: DeviceEnv, inside_bundle: Path) -> None:
    """docs/loading.md's example, as a user would run it: same result either way; the load overlapped start-up."""
    proc = subprocess.run(
        [str(device_env.python), str(EXAMPLE), str(inside_bundle / "model.fp32.tflite"), "--app-start-ms", "150"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outputs_equal"] is True
    blocking, background = result["blocking"], result["background"]
    assert blocking["time_to_first_result_ms"] > 0 and background["time_to_first_result_ms"] > 0
    # ordering, not durations: in the blocking pattern the load starts after start-up; in the background one
    # it starts before start-up has finished
    assert blocking["load_started_ms"] >= blocking["app_ready_ms"]
    assert background["load_started_ms"] < background["app_ready_ms"]


# ------------------------------------------------------------------------------------------ host gates


def test_throughput_floor_from_a_profile_gates_the_measured_curve(
    device_env: DeviceEnv, inside_bundle: Path, tmp_path: Path
) -> None:
    """A user profile sets ``min_throughput_ips``; the check policy carries it; the gate judges the curve the
    runner measured (an unreachable floor fails and names the best point, a low one passes, none is skipped)."""
    from toolkit.checks.gates.throughput import judge_throughput
    from toolkit.model.runner_report import parse_runner_output
    from toolkit.model.targets import check_policy_from_profile
    from toolkit.model.targets import get_profile

    (tmp_path / "fast-box.toml").write_text('extends = "generic-x86_64"\nname = "fast-box"\n'
                                            'description = "a box that must sustain a camera"\n'
                                            "min_throughput_ips = 1e12\n")
    policy = check_policy_from_profile(get_profile("fast-box", targets_dirs=[tmp_path]))
    assert policy.min_throughput_ips == 1e12
    floor = policy.min_throughput_ips
    doc = check(device_env, inside_bundle, "--runs", "10", "--warmup", "1", "--throughput",
                "--artifact", "model.fp32.onnx")
    (report,) = parse_runner_output(json.dumps(doc), device="here", artifacts=["model.fp32.onnx"])
    failure, skip = judge_throughput(report, floor)
    assert skip is None and failure and "inferences/s (batch" in failure and "at least 1e+12/s" in failure
    assert judge_throughput(report, 1.0) == (None, None)
    plain = check(device_env, inside_bundle, "--runs", "5", "--warmup", "1", "--artifact", "model.fp32.onnx")
    (unmeasured,) = parse_runner_output(json.dumps(plain), device="here", artifacts=["model.fp32.onnx"])
    failure, skip = judge_throughput(unmeasured, floor)
    assert failure is None and skip and "--throughput" in skip


def test_tensorrt_engine_cache_directory_lands_on_the_device(device_env: DeviceEnv, tmp_path: Path) -> None:
    """The provider options a TensorRT artifact carries (the Jetson profiles': trt_engine_cache_path = "trt_cache")
    become a directory under the runner's cache on the device. Only the path handling can run here: the CPU-only
    wheel has no TensorRT provider, so no engine is built."""
    runner_dir = device_side.source_path(device_side.RUNNER_FILE).parent
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import edgetk_runner as r\n"
        "p, o, missing = r.select_providers(['TensorrtExecutionProvider', 'CPUExecutionProvider'],\n"
        "    ['TensorrtExecutionProvider', 'CPUExecutionProvider'],\n"
        "    {'TensorrtExecutionProvider': {'trt_engine_cache_enable': True, 'trt_engine_cache_path': 'trt_cache'}})\n"
        "print(json.dumps(r.device_provider_options(p, o, sys.argv[2])))\n"
    )
    proc = subprocess.run([str(device_env.python), "-c", code, str(runner_dir), str(tmp_path / "cache" / "abc")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    trt, cpu = json.loads(proc.stdout)
    assert trt["trt_engine_cache_path"] == str(tmp_path / "cache" / "abc" / "trt_cache")
    assert (tmp_path / "cache" / "abc" / "trt_cache").is_dir() and trt["trt_engine_cache_enable"] == "true"
    assert cpu == {}
