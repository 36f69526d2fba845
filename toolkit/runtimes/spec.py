"""One row per runtime: what format it runs, the package that is it, how to prove it loads, how to install it.

Everything that names a runtime's package reads this table: device setup (:mod:`toolkit.delivery.provisioning`:
what to install, what to import to prove it loads) and the on-device runner, whose own copy of the table
(``_PACKAGES``, ``INSTALL_HINTS``; the runner is a standalone file and imports nothing from here) a test keeps
equal to these rows. A new runtime is one row here, its name in :class:`toolkit.model.vocabulary.Runtime`, and its
loader (a host session in :mod:`toolkit.runtimes.execution`, the runner's loader on the device).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.model.vocabulary import Format, Runtime


@dataclass(frozen=True)
class RuntimeSpec:
    """A runtime's facts. ``distributions``: the pip distributions that can be it, the one setup installs
    first (the runner asks each for its version, in order). ``module``: what the runner imports;
    ``verify_module``: what setup imports to prove the install loads. ``requirements``: what it needs but does
    not declare (a version rule such as ``numpy<2`` included); ``without_deps``: installed ``--no-deps`` (its
    declared dependencies are exporter tooling).
    """

    runtime: Runtime
    format: Format
    distributions: tuple[str, ...]
    module: str
    verify_module: str
    install_hint: str
    requirements: tuple[str, ...] = ()
    without_deps: bool = False

    @property
    def distribution(self) -> str:
        """The distribution setup installs."""
        return self.distributions[0]


RUNTIME_SPECS: tuple[RuntimeSpec, ...] = (
    RuntimeSpec(Runtime.LITERT, Format.TFLITE, ("ai-edge-litert", "ai-edge-litert-nightly"), "ai_edge_litert",
                "ai_edge_litert.interpreter", "pip install ai-edge-litert"),
    # tflite-runtime 2.14 was built against numpy 1.x, declares only numpy>=1.23.2 and fails to import under numpy 2
    RuntimeSpec(Runtime.TFLITE_RUNTIME, Format.TFLITE, ("tflite-runtime", "tflite-runtime-nightly"), "tflite_runtime",
                "tflite_runtime.interpreter", "pip install tflite-runtime", requirements=("numpy<2",)),
    RuntimeSpec(Runtime.TENSORFLOW, Format.TFLITE,
                ("tensorflow", "tensorflow-cpu", "tensorflow-aarch64", "tensorflow-intel", "tf-nightly"),
                "tensorflow", "tensorflow", "pip install tensorflow"),
    RuntimeSpec(Runtime.ONNXRUNTIME, Format.ONNX,
                ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml", "onnxruntime-qnn"),
                "onnxruntime", "onnxruntime", "pip install onnxruntime"),
    # ExecuTorch's Python runtime imports torch (undeclared; pip pulls torch: on x86_64 PyPI's is the CUDA build,
    # aarch64 wheels are CPU-only), ruamel.yaml, flatbuffers, and for ETDump profiles tabulate and pandas: measured
    # in a bare venv, those are what executorch.runtime, the bundled-program check and devtools' Inspector import.
    # Its declared dependencies are the exporter's tooling (hydra-core needs antlr4-python3-runtime, which has no
    # wheel; coremltools has no aarch64 wheel and pip, asked from an x86_64 host with --platform, evaluates its
    # x86_64 marker for this host), hence --no-deps.
    RuntimeSpec(Runtime.EXECUTORCH, Format.PTE, ("executorch",), "executorch", "executorch.runtime",
                "pip install executorch (it pulls torch; on a small device take torch's CPU wheel)",
                requirements=("torch", "ruamel.yaml", "flatbuffers", "tabulate", "pandas"), without_deps=True),
)
SPECS: dict[Runtime, RuntimeSpec] = {spec.runtime: spec for spec in RUNTIME_SPECS}


def runtimes_for(fmt: Format) -> tuple[Runtime, ...]:
    """The runtimes that run ``fmt``, in the table's order (the runner tries them in this order)."""
    return tuple(spec.runtime for spec in RUNTIME_SPECS if spec.format == fmt)
