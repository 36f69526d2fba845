"""Section ``int8`` (issue 13, speed): what INT8 buys on this CPU, and which of the toolkit's INT8 knobs matter.

Three measurements, each side by side in one process (variants interleaved in rounds, medians, ratios; every
ONNX Runtime session with ``session.intra_op.allow_spinning=0`` so an idle pool never slows the next variant):

1. The ceiling: one large GEMM (256x1024 @ 1024x1024) in fp32 and in INT8, in ONNX Runtime (``MatMul`` vs
   ``MatMulInteger`` u8 x s8, the kernel the U8S8 recipes reach) and in LiteRT/XNNPACK (``FULLY_CONNECTED``
   fp32 vs full int8). The INT8/fp32 latency ratio of a compute-bound GEMM is what the CPU's int8 instructions
   allow: AVX-512 VNNI / AVX-VNNI (``vpdpbusd``: 4 u8 x s8 products summed per lane in one instruction) or, on
   AVX2 only, ``vpmaddubsw`` + ``vpmaddwd`` + ``vpaddd`` (three instructions for what one FMA does for fp32 at
   a quarter of the width). A network's INT8 cannot beat its GEMMs' ceiling by much.
2. MobileNetV2 (224x224, 2 threads) through ONNX Runtime: the toolkit's recipe (QDQ, uint8 activations x int8
   weights, per-channel, what generic-x86_64 lists) against the other settings of the same quantizer: QOperator,
   per-tensor, ``reduce_range``, S8S8 and U8U8, and the graph optimisation levels ONNX Runtime applies to the
   QDQ graph (``ORT_ENABLE_ALL`` fuses Q/DQ pairs into QLinearConv and converts to its blocked NCHWc layout;
   ``EXTENDED`` and ``BASIC`` stop earlier).
3. MobileNetV2 through LiteRT: full int8 (int8 I/O, no float op left: the graph is checked), per-channel (the
   converter's default, the toolkit's recipe) vs per-tensor.
4. The A16W8 recipe (16-bit activations, 8-bit weights: the accuracy fallback after 8-bit INT8, never preferred)
   in both runtimes: ONNX built by the toolkit's own route (``onnx_quant.derive``: int16 Q/DQ as contrib ops at
   the model's opset), TFLite by the converter's 16x8 ops set (what ``tflite._a16w8`` runs). It is there for
   accuracy and 4x smaller weights; these rows say what it costs in latency.

The model is ``benchmarks.convert.mobilenet_source`` (random weights, BatchNorm statistics from data); 16
calibration samples are enough for ranges whose only use here is speed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import THREADS, LiteRunner, OrtRunner, interleaved, log, machine, table, work_dir

TITLE = "INT8 speed: the CPU's ceiling and the recipe's knobs (issue 13)"
TARGET = 0.45
ROUNDS = 10
CALIBRATION = 16
GEMM = (256, 1024, 1024)  # M, K, N


def _cpu_int8() -> tuple[str, bool]:
    flags = machine()["CPU flags that matter here"]
    vnni = any(f in flags.split(", ") for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    return flags, vnni


# --------------------------------------------------------------------------------------------- the ceiling


def _gemm_onnx(root: Path) -> tuple[Path, Path, np.ndarray]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = GEMM
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((k, n)).astype(np.float32) * 0.05
    fp32 = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm_fp32",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(weight, "w")]), opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    qweight = np.clip(np.round(weight / (np.abs(weight).max() / 127)), -127, 127).astype(np.int8)
    int8 = helper.make_model(helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["y"])], "gemm_int8",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])],
        [numpy_helper.from_array(qweight, "w"), numpy_helper.from_array(np.array(128, np.uint8), "xz"),
         numpy_helper.from_array(np.array(0, np.int8), "wz")]), opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    paths = root / "gemm_fp32.onnx", root / "gemm_int8.onnx"
    onnx.save(fp32, paths[0])
    onnx.save(int8, paths[1])
    return paths[0], paths[1], rng.standard_normal((m, k)).astype(np.float32)


def _gemm_tflite(root: Path) -> tuple[Path, Path, np.ndarray]:
    import keras
    import tensorflow as tf

    m, k, n = GEMM
    paths = root / "gemm_fp32.tflite", root / "gemm_int8.tflite"
    rng = np.random.default_rng(0)
    samples = rng.standard_normal((8, m, k)).astype(np.float32)
    if not all(p.is_file() for p in paths):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((k,), batch_size=m), keras.layers.Dense(n, use_bias=False)])
        paths[0].write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([s] for s in samples)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
        paths[1].write_bytes(converter.convert())
    return paths[0], paths[1], samples[0]


def ceiling(root: Path) -> tuple[list[list[Any]], dict[str, float]]:
    ort32, ort8, x = _gemm_onnx(root)
    lite32, lite8, xl = _gemm_tflite(root)
    xq = np.clip(np.round(x / (np.abs(x).max() / 127)) + 128, 0, 255).astype(np.uint8)
    variants: dict[str, Callable[[], object]] = {
        "onnxruntime MatMul fp32": OrtRunner(ort32, {"x": x}),
        "onnxruntime MatMulInteger u8 x s8": OrtRunner(ort8, {"x": xq}),
        "litert FULLY_CONNECTED fp32": LiteRunner(lite32, xl),
        "litert FULLY_CONNECTED int8": LiteRunner(lite8, xl),
    }
    log("int8: GEMM ceiling, interleaved")
    timed = interleaved(variants, rounds=ROUNDS, per_round=5, warmup=2)
    macs = float(np.prod(GEMM))
    rows, ratios = [], {}
    for runtime, fp32_key, int8_key in (("onnxruntime", "onnxruntime MatMul fp32", "onnxruntime MatMulInteger u8 x s8"),
                                        ("litert", "litert FULLY_CONNECTED fp32", "litert FULLY_CONNECTED int8")):
        for key in (fp32_key, int8_key):
            t = timed[key].median
            rows.append([key, f"{t:.2f}", f"{macs / t / 1e6:.1f}", f"{t / timed[fp32_key].median:.2f}x",
                         timed[key].runs])
        ratios[runtime] = timed[int8_key].median / timed[fp32_key].median
    return rows, ratios


# --------------------------------------------------------------------------------------------- MobileNetV2


def _tf2onnx_fp32(source: Path, out: Path) -> Path:
    if out.is_file():
        return out
    import keras
    import tensorflow as tf
    import tf2onnx

    model = keras.saving.load_model(source)
    spec = (tf.TensorSpec((1, 224, 224, 3), tf.float32, name="input"),)
    proto, _ = tf2onnx.convert.from_function(tf.function(lambda t: model(t)), input_signature=spec, opset=17)
    out.write_bytes(proto.SerializeToString())
    return out


ORT_VARIANTS: dict[str, dict[str, Any]] = {
    # name: quantize_static settings; the first is the generic-x86_64 recipe
    "QDQ U8S8 per-channel (toolkit recipe)": {"fmt": "qdq", "act": "u8", "wt": "s8", "per_channel": True},
    "QDQ U8S8 per-channel reduce_range": {"fmt": "qdq", "act": "u8", "wt": "s8", "per_channel": True,
                                          "reduce_range": True},
    "QDQ U8S8 per-tensor": {"fmt": "qdq", "act": "u8", "wt": "s8", "per_channel": False},
    "QOperator U8S8 per-channel": {"fmt": "qop", "act": "u8", "wt": "s8", "per_channel": True},
    "QDQ S8S8 per-channel": {"fmt": "qdq", "act": "s8", "wt": "s8", "per_channel": True},
    "QDQ U8U8 per-channel": {"fmt": "qdq", "act": "u8", "wt": "u8", "per_channel": True},
}


def _ort_int8(fp32: Path, root: Path, samples: np.ndarray) -> dict[str, Path]:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = root / "mobilenetv2.pre.onnx"
    if not pre.is_file():
        quant_pre_process(str(fp32), str(pre))  # what the toolkit's INT8 route runs first
    types = {"u8": QuantType.QUInt8, "s8": QuantType.QInt8}
    out = {}
    for index, (name, v) in enumerate(ORT_VARIANTS.items()):
        path = root / f"mobilenetv2.int8.{index}.onnx"
        if not path.is_file():
            feeds = iter([{"input": s[None]} for s in samples])

            class Reader(CalibrationDataReader):
                def get_next(self) -> dict[str, np.ndarray] | None:
                    return next(feeds, None)  # noqa: B023 - consumed within this iteration

            log(f"int8: quantize_static {name}")
            quantize_static(str(pre), str(path), Reader(),
                            quant_format=QuantFormat.QDQ if v["fmt"] == "qdq" else QuantFormat.QOperator,
                            activation_type=types[v["act"]], weight_type=types[v["wt"]],
                            per_channel=v["per_channel"], reduce_range=v.get("reduce_range", False))
        out[name] = path
    return out


def _ort_a16w8(fp32: Path, root: Path, samples: np.ndarray) -> Path:
    """MobileNetV2 A16W8 ONNX through the toolkit's own route (the generic-x86_64 A16W8 recipe, opset <= 19)."""
    import dataclasses

    from toolkit.conversion.onnx import quant as onnx_quant
    from toolkit.conversion.base import ConversionRequest
    from toolkit.sources import open_source
    from toolkit.model.recipe import Recipe

    path = root / "mobilenetv2.a16w8.onnx"
    if path.is_file():
        return path
    recipe = Recipe(format="onnx", precision="int8", activation_type="int16", weight_type="int8", quant_format="qdq",
                    calibration_method="minmax", per_channel=True)
    request = ConversionRequest(source=open_source(str(fp32)), recipe=recipe, input_shapes={"input": (1, 224, 224, 3)},
                                calibration=tuple({"input": s[None]} for s in samples), workdir=root / "a16w8-work",
                                max_opset=19)
    log("int8: A16W8 ONNX through the toolkit's route")
    base = onnx_quant.prepare(dataclasses.replace(request, recipe=Recipe(format="onnx", precision="fp32")),
                              root / "mobilenetv2.a16w8-base.onnx")
    onnx_quant.derive(request, base, path)
    return path


def _ort_with_level(path: Path, feed: np.ndarray, level: str) -> OrtRunner:
    import onnxruntime as ort

    runner = OrtRunner(path, {"input": feed})
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    runner.session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    return runner


def _tflite(source: Path, root: Path, samples: np.ndarray) -> dict[str, Path]:
    import keras
    import tensorflow as tf

    paths = {"fp32": root / "mobilenetv2.fp32.tflite", "int8 per-channel (toolkit recipe)":
             root / "mobilenetv2.int8.tflite", "int8 per-tensor": root / "mobilenetv2.int8-pt.tflite",
             "A16W8 16x8 (toolkit A16W8 recipe)": root / "mobilenetv2.a16w8.tflite"}
    if all(p.is_file() for p in paths.values()):
        return paths
    model = keras.saving.load_model(source)
    paths["fp32"].write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    for name, per_tensor in (("int8 per-channel (toolkit recipe)", False), ("int8 per-tensor", True)):
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([s[None]] for s in samples)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
        converter._experimental_disable_per_channel = per_tensor
        log(f"int8: TFLite {name}")
        paths[name].write_bytes(converter.convert())
    converter = tf.lite.TFLiteConverter.from_keras_model(model)  # the toolkit's A16W8 build (tflite._a16w8)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([s[None]] for s in samples)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    log("int8: TFLite A16W8 (16x8)")
    paths["A16W8 16x8 (toolkit A16W8 recipe)"].write_bytes(converter.convert())
    return paths


def _float_ops(path: Path) -> list[str]:
    """The ops of a TFLite model that read or write a float32 tensor (none in a fully int8 graph)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    details = {d["index"]: d for d in interpreter.get_tensor_details()}
    found = []
    for op in interpreter._get_ops_details():  # noqa: SLF001 - the public API has no op list
        tensors = [*op["inputs"], *op["outputs"]]
        if any(i in details and details[i]["dtype"] == np.float32 for i in tensors):
            found.append(op["op_name"])
    return sorted(set(found))


def mobilenet(root: Path) -> tuple[list[list[Any]], dict[str, float], list[str]]:
    from benchmarks.convert import mobilenet_source

    source, _, samples = mobilenet_source(work_dir() / "convert")
    calib = samples[:CALIBRATION]
    feed = samples[-1:]
    fp32 = _tf2onnx_fp32(source, root / "mobilenetv2.fp32.onnx")
    ort_paths = _ort_int8(fp32, root, calib)
    lite_paths = _tflite(source, root, calib)
    notes = []
    leftover = _float_ops(lite_paths["int8 per-channel (toolkit recipe)"])
    notes.append("LiteRT int8 graph: " + (f"float ops left: {', '.join(leftover)}" if leftover else
                                          "no op reads or writes a float tensor (fully int8, int8 I/O)"))
    variants: dict[str, Callable[[], object]] = {"onnxruntime fp32": OrtRunner(fp32, {"input": feed})}
    for name, path in ort_paths.items():
        variants[f"onnxruntime {name}"] = OrtRunner(path, {"input": feed})
    variants["onnxruntime QDQ A16W8 per-channel (toolkit A16W8 recipe)"] = OrtRunner(_ort_a16w8(fp32, root, calib),
                                                                                    {"input": feed})
    recipe = ort_paths["QDQ U8S8 per-channel (toolkit recipe)"]
    for level in ("ORT_ENABLE_EXTENDED", "ORT_ENABLE_BASIC"):
        variants[f"onnxruntime QDQ U8S8 per-channel, {level}"] = _ort_with_level(recipe, feed, level)
    for name, path in lite_paths.items():
        variants[f"litert {name}"] = LiteRunner(path, feed)
    log(f"int8: timing {len(variants)} MobileNetV2 variants, interleaved")
    timed = interleaved(variants, rounds=ROUNDS, per_round=10, warmup=2)
    rows, ratios = [], {}
    for key, t in timed.items():
        base = timed["onnxruntime fp32" if key.startswith("onnxruntime") else "litert fp32"].median
        ratios[key] = t.median / base
        rows.append([key, f"{t.median:.2f}", f"{t.median / base:.2f}x", t.runs])
    return rows, ratios, notes


def run() -> tuple[str, dict[str, Any]]:
    root = work_dir() / "int8"
    root.mkdir(parents=True, exist_ok=True)
    flags, vnni = _cpu_int8()
    load_before = " ".join(f"{v:.2f}" for v in os.getloadavg())
    gemm_rows, gemm = ceiling(root)
    rows, ratios, notes = mobilenet(root)
    ort = ratios["onnxruntime QDQ U8S8 per-channel (toolkit recipe)"]
    lite = ratios["litert int8 per-channel (toolkit recipe)"]
    best_ort = min((v, k) for k, v in ratios.items()
                   if k.startswith("onnxruntime") and "fp32" not in k and "A16W8" not in k)
    a16w8 = {rt: next(v for k, v in ratios.items() if k.startswith(rt) and "A16W8" in k)
             for rt in ("onnxruntime", "litert")}
    cpu = machine()["CPU"]
    instructions = ("VNNI (vpdpbusd)" if vnni else
                    "no VNNI: AVX2's vpmaddubsw + vpmaddwd + vpaddd for every 32 u8 x s8 products (XNNPACK's "
                    "s8 x s8 kernels sign-extend to 16 bits first)")
    verdict = [
        f"- CPU: {cpu}; int8-relevant flags: {flags}. INT8 dot products: {instructions}.",
        f"- Ceiling (compute-bound GEMM): INT8 at **{gemm['onnxruntime']:.2f}x** fp32 latency in ONNX Runtime, "
        f"**{gemm['litert']:.2f}x** in LiteRT/XNNPACK.",
        f"- MobileNetV2, toolkit recipe: ONNX Runtime **{ort:.2f}x**, LiteRT **{lite:.2f}x** fp32 (target <= "
        f"{TARGET}x: ONNX Runtime {'met' if ort <= TARGET else 'NOT met'}, LiteRT "
        f"{'met' if lite <= TARGET else 'NOT met'}). Fastest ONNX Runtime setting here: {best_ort[1]} "
        f"({best_ort[0]:.2f}x).",
    ]
    verdict.append(
        f"- A16W8 (the accuracy fallback, never preferred): ONNX Runtime **{a16w8['onnxruntime']:.2f}x**, LiteRT "
        f"**{a16w8['litert']:.2f}x** fp32 latency (ORT runs float kernels between the int16 Q/DQ; LiteRT's 16x8 "
        "kernels are reference kernels, no XNNPACK): what a model pays when 8-bit activations lose it.")
    if not vnni:
        verdict.append(
            f"- What stops the target on this CPU: without VNNI its int8 GEMM ceiling is {gemm['onnxruntime']:.2f}x "
            f"(ORT) / {gemm['litert']:.2f}x (XNNPACK) of fp32, and MobileNetV2 also spends time in depthwise "
            "convolutions and elementwise ops that INT8 speeds up less than its 1x1 convolutions. 0.45x needs a "
            "CPU with VNNI (AVX-512 VNNI or AVX-VNNI: Intel Ice Lake / Alder Lake and later, AMD Zen 4 and later), "
            "where the same recipes measured 0.48-0.50x (docs/benchmarks.md history, findings.md 5).")
    notes += [f"Load average at the start {load_before}, at the end "
              f"{' '.join(f'{v:.2f}' for v in os.getloadavg())} (a shared machine: ratios hold better than ms)."]
    parts = [f"## {TITLE}", "", *verdict, "",
             "### The ceiling: one GEMM 256x1024 @ 1024x1024, 2 threads", "",
             table(["variant", "median ms", "GMAC/s", "vs fp32", "runs"], gemm_rows), "",
             "### MobileNetV2 224x224, batch 1, 2 threads", "",
             table(["variant", "median ms", "vs fp32 (same runtime)", "runs"], rows), "",
             *[f"- {n}" for n in notes]]
    headline = {"gemm_int8_vs_fp32": gemm, "mobilenetv2": ratios, "vnni": vnni,
                "toolkit_ort": ort, "toolkit_litert": lite, "a16w8": a16w8}
    return "\n".join(parts), headline


if __name__ == "__main__":  # pragma: no cover
    print(run()[0])
