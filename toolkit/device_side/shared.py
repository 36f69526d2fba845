"""What the host and the shipped device-side files share, written once: the runtime table and a file's sha256.

Each block is inlined into the shipped runner and helper where its marker line stands when they are assembled
(``toolkit.device_side``); the host imports this module. Python >= 3.6, stdlib only, typed by type comments.
"""
from typing import Any, Dict, Tuple  # noqa: F401 (type comments)

# --- begin runtime table (inlined into the runner when it is assembled: toolkit.device_side) ---
# One row per runtime, in the order the runner tries them for a format (names as in toolkit.model.vocabulary.Runtime).
# format: what it runs; distributions: the pip distributions that can be it, the one setup installs first (the
# runner asks each for its version, in order); module: what the runner imports; verify_module: what setup imports
# to prove the install loads; install_hint; requirements: what it needs but does not declare (a version rule such
# as numpy<2 included); without_deps: installed --no-deps (its declared dependencies are exporter tooling).
RUNTIME_ROWS = (
    {"runtime": "litert", "format": "tflite", "distributions": ("ai-edge-litert", "ai-edge-litert-nightly"),
     "module": "ai_edge_litert", "verify_module": "ai_edge_litert.interpreter",
     "install_hint": "pip install ai-edge-litert"},
    # tflite-runtime 2.14 was built against numpy 1.x, declares only numpy>=1.23.2 and fails to import under numpy 2
    {"runtime": "tflite-runtime", "format": "tflite", "distributions": ("tflite-runtime", "tflite-runtime-nightly"),
     "module": "tflite_runtime", "verify_module": "tflite_runtime.interpreter",
     "install_hint": "pip install tflite-runtime", "requirements": ("numpy<2",)},
    {"runtime": "tensorflow", "format": "tflite",
     "distributions": ("tensorflow", "tensorflow-cpu", "tensorflow-aarch64", "tensorflow-intel", "tf-nightly"),
     "module": "tensorflow", "verify_module": "tensorflow", "install_hint": "pip install tensorflow"},
    {"runtime": "onnxruntime", "format": "onnx",
     "distributions": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml",
                       "onnxruntime-qnn"),
     "module": "onnxruntime", "verify_module": "onnxruntime", "install_hint": "pip install onnxruntime"},
    # ExecuTorch runs on the device through the native runner (device_side/pte_runner.cpp, built by setup against
    # this wheel's libraries, which need only libc and libstdc++): no torch. Its declared dependencies are the
    # exporter's tooling (hydra-core needs antlr4-python3-runtime, which has no wheel; coremltools has no aarch64
    # wheel), hence --no-deps. Its Python binding (executorch.runtime) is the fallback where no runner could be
    # built; it imports torch (undeclared: the release it was built against, 2.13.0 for executorch 1.5.1), which
    # setup does not install.
    {"runtime": "executorch", "format": "pte", "distributions": ("executorch",), "module": "executorch",
     "verify_module": "executorch",
     "install_hint": "edgetk devices setup --device DEVICE --runtime executorch (executorch --no-deps and the "
                     "native .pte runner, no torch)",
     "without_deps": True},
)  # type: Tuple[Dict[str, Any], ...]
# --- end runtime table ---

# --- begin file hash (inlined into the runner and the helper when they are assembled: toolkit.device_side) ---


def sha256_file(path):
    # type: (str) -> str
    """The file's sha256 in hex, read in 1 MiB blocks."""
    import hashlib  # here, not at the top: the helper's push finish usually hashes nothing (the follower did)

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(1 << 20)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()
# --- end file hash ---
