"""LiteRT (ai-edge-litert): a TFLite runtime (tflite.py's loader), and its CompiledModel API, which --loads uses
for XNNPACK's weight cache.
"""
import os
import time
from typing import Any, Callable, Dict, List  # noqa: F401
from .base import RunnerError
from .loading import first_inference, page_cache_state
from .models import Model, Tensor, artifact_cache_dir, import_numpy
from .tflite import TFLiteLoader

# --- shipped from here (the lines above are for the host's type checker) ---

class CompiledTFLite(Model):
    """LiteRT's CompiledModel API: used here only to measure XNNPACK's weight cache, which the Interpreter API
    of ai-edge-litert 2.3 does not offer (``CpuOptions.xnnpack_weight_cache_path``)."""

    format = "tflite"

    def __init__(self, path, threads, weight_cache):
        # type: (str, int, Any) -> None
        t0 = time.perf_counter()
        try:
            from ai_edge_litert.compiled_model import CompiledModel
            from ai_edge_litert.hardware_accelerator import HardwareAccelerator
            from ai_edge_litert.options import Options
        except ImportError as exc:
            raise RunnerError("missing_runtime", "LiteRT's CompiledModel API is not available here ({}).".format(
                exc), "pip install -U ai-edge-litert")
        t1 = time.perf_counter()
        numpy = import_numpy()
        options = Options()
        options.hardware_accelerators = HardwareAccelerator.CPU
        options.cpu_options.num_threads = threads
        if weight_cache:
            options.cpu_options.xnnpack_weight_cache_path = weight_cache
        self.model = CompiledModel.from_file(path, options=options)
        signature = sorted(self.model.get_signature_list())[0]
        details = sorted(self.model.get_input_tensor_details(signature).values(), key=lambda d: d.get("index", 0))
        self.inputs = [Tensor(d["name"], [int(x) for x in d["shape"]], numpy.dtype(d["dtype"]), 0.0, 0, k)
                       for k, d in enumerate(details)]
        self.in_buffers = self.model.create_input_buffers(0)
        self.out_buffers = self.model.create_output_buffers(0)
        self.import_ms = round((t1 - t0) * 1000.0, 3)
        self.load_ms = round((time.perf_counter() - t1) * 1000.0, 3)
        self.runtime = "litert"
        self.extra = {"api": "CompiledModel"}

    def set_inputs(self, pairs):
        # type: (list) -> None
        for tensor, array in pairs:
            self.in_buffers[tensor.key].write(array)

    def invoke(self):
        # type: () -> list
        self.model.run_by_index(0, self.in_buffers, self.out_buffers)
        return []


class LiteRTLoader(TFLiteLoader):
    """LiteRT, the TFLite runtime tried first."""

    load_variants = ("litert-compiled", "xnnpack-cache")

    def interpreter_class(self):
        # type: () -> Any
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter

    def delegate_loader(self):
        # type: () -> Any
        from ai_edge_litert.interpreter import load_delegate

        return load_delegate

    def measure_variant(self, variant, numpy, path, record, threads, opts, golden_inputs, out):
        # type: (str, Any, str, Dict[str, Any], int, Any, list, Dict[str, Any]) -> None
        """litert-compiled: the CompiledModel API without a weight cache; xnnpack-cache: with the cache file in
        the device cache (--fresh-cache removes it first: the load that packs the weights)."""
        weights = os.path.join(artifact_cache_dir(opts, record), os.path.basename(path) + ".xnnpack_cache")
        cached = variant == "xnnpack-cache"
        if cached and getattr(opts, "fresh_cache", False) and os.path.exists(weights):
            os.remove(weights)
        page_cache_state(path, opts, out)
        first_inference(numpy, CompiledTFLite(path, threads, weights if cached else None), record, golden_inputs,
                        out)
        if cached:
            out["cache_bytes"] = os.path.getsize(weights) if os.path.isfile(weights) else None

    def load_options(self, one, warm):
        # type: (Callable[..., Dict[str, Any]], Dict[str, Any]) -> List[Dict[str, Any]]
        before = one("--load-variant", "litert-compiled")
        prepare = one("--load-variant", "xnnpack-cache", "--fresh-cache")
        after = one("--load-variant", "xnnpack-cache")
        return [{
            "name": "xnnpack_weight_cache", "before": before, "prepare": prepare, "after": after,
            "note": "LiteRT's CompiledModel API with CpuOptions.xnnpack_weight_cache_path: the first load packs the "
                    "weights into the cache file, later loads map it instead of packing again."}]
