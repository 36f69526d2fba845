#!/usr/bin/env python3
"""Load the model on a thread while the app starts, and compare time-to-first-result with a blocking load.

    python3 background_load.py MODEL.tflite|MODEL.onnx [--app-start-ms 150]

Each pattern runs in a fresh Python process (a second load in the same process would find the runtime already
imported), and one JSON line comes out::

    {"blocking": {...}, "background": {...}, "outputs_equal": true}

where each pattern has ``time_to_first_result_ms`` (from the process's start of ``main`` to the first result),
``app_ready_ms``, ``load_started_ms`` and ``load_done_ms`` on the same clock. Needs numpy and one runtime
(ai-edge-litert, tflite-runtime or onnxruntime); Python >= 3.6. docs/loading.md explains when it pays.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time


def load(path):
    """(run(x) -> first output, input shape, input dtype) for a .tflite or .onnx file."""
    import numpy as np

    if path.endswith(".onnx"):
        import onnxruntime as ort

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        node = session.get_inputs()[0]
        dtypes = {"tensor(float)": np.float32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
                  "tensor(int64)": np.int64, "tensor(int32)": np.int32}
        shape = [d if isinstance(d, int) else 1 for d in node.shape]

        def run_onnx(x):
            return session.run(None, {node.name: x})[0]

        return run_onnx, shape, dtypes.get(node.type, np.float32)
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        from tflite_runtime.interpreter import Interpreter
    interpreter = Interpreter(model_path=path)
    interpreter.allocate_tensors()
    inp = interpreter.get_input_details()[0]
    out = interpreter.get_output_details()[0]

    def run_tflite(x):
        interpreter.set_tensor(inp["index"], x)
        interpreter.invoke()
        return interpreter.get_tensor(out["index"]).copy()

    return run_tflite, [int(d) for d in inp["shape"]], inp["dtype"]


def app_start(ms):
    """Stands for the app's own start-up (reading its config, opening the camera, drawing the first screen)."""
    time.sleep(ms / 1000.0)


class BackgroundModel(object):
    """Starts loading at once on a daemon thread; ``get()`` waits for it (and re-raises a failed load)."""

    def __init__(self, path):
        self._done = threading.Event()
        self._model = None
        self._error = None
        self.started = time.perf_counter()
        self.finished = None
        thread = threading.Thread(target=self._load, args=(path,))
        thread.daemon = True
        thread.start()

    def _load(self, path):
        try:
            self._model = load(path)
        except BaseException as exc:  # handed to the caller of get(), not lost in the thread
            self._error = exc
        finally:
            self.finished = time.perf_counter()
            self._done.set()

    def get(self, timeout=None):
        if not self._done.wait(timeout):
            raise RuntimeError("the model did not load within {} s".format(timeout))
        if self._error is not None:
            raise self._error
        return self._model


def sample(shape, dtype):
    import numpy as np

    state = np.random.RandomState(0)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return state.randint(info.min, int(info.max) + 1, size=shape).astype(dtype)
    return state.standard_normal(shape).astype(dtype)


def one_pattern(path, pattern, app_ms):
    t0 = time.perf_counter()

    def ms(t):
        return round((t - t0) * 1000.0, 3)

    if pattern == "blocking":
        app_start(app_ms)
        ready = time.perf_counter()
        started = time.perf_counter()
        run, shape, dtype = load(path)
        done = time.perf_counter()
    else:
        background = BackgroundModel(path)
        started = background.started
        app_start(app_ms)
        ready = time.perf_counter()
        run, shape, dtype = background.get(timeout=600)
        done = background.finished
    result = run(sample(shape, dtype))
    first = time.perf_counter()
    return {"time_to_first_result_ms": ms(first), "app_ready_ms": ms(ready), "load_started_ms": ms(started),
            "load_done_ms": ms(done), "result": [float(v) for v in result.ravel()[:64]]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--app-start-ms", type=float, default=150.0)
    parser.add_argument("--pattern", choices=("blocking", "background"), default=None)
    args = parser.parse_args(argv)
    if args.pattern:
        print(json.dumps(one_pattern(os.path.abspath(args.model), args.pattern, args.app_start_ms)))
        return 0
    out = {}
    for pattern in ("blocking", "background"):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), args.model, "--pattern", pattern,
                               "--app-start-ms", str(args.app_start_ms)],
                              stdout=subprocess.PIPE, universal_newlines=True, check=True)
        out[pattern] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["outputs_equal"] = out["blocking"].pop("result") == out["background"].pop("result")
    out["saved_ms"] = round(out["blocking"]["time_to_first_result_ms"] - out["background"]["time_to_first_result_ms"],
                            3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
