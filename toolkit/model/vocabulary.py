"""The closed vocabularies every record, file and flag uses (Precision, Format, Runtime, Framework, ...).

Stdlib only, so that every stage (and the CLI's ``--help``) can import it for free. Members ARE their strings
(``StrEnum``): JSON and TOML hold the plain words, and readers turn them into members at the boundary.
"""

from __future__ import annotations

from enum import StrEnum


class _Word(StrEnum):
    """A closed vocabulary. Members ARE their strings (``Precision.INT8 == "int8"``, ``json.dumps`` writes
    ``"int8"``), so files, flags and older callers that pass plain strings keep working; ``repr`` shows the
    plain string too, so messages read ``'int8'`` and not ``<Precision.INT8: 'int8'>``."""

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


class Precision(_Word):
    FP32 = "fp32"
    FP16 = "fp16"
    DYNAMIC = "dynamic"
    INT8 = "int8"


class Format(_Word):
    TFLITE = "tflite"
    ONNX = "onnx"
    PTE = "pte"  # an ExecuTorch program (PyTorch sources only), XNNPACK-delegated


class Runtime(_Word):
    """Runtime names, everywhere (profiles, reports, flags): the package each one is."""

    LITERT = "litert"  # ai_edge_litert
    TFLITE_RUNTIME = "tflite-runtime"  # tflite_runtime
    TENSORFLOW = "tensorflow"  # tensorflow.lite
    ONNXRUNTIME = "onnxruntime"
    EXECUTORCH = "executorch"  # executorch (its Python runtime imports torch)


class Framework(_Word):
    """What a SOURCE is (``toolkit.sources.detect``): from its path and content, never from a flag."""

    KERAS = "keras"
    SAVEDMODEL = "savedmodel"
    ONNX = "onnx"
    TFLITE = "tflite"
    TORCHSCRIPT = "torchscript"
    EXPORTED_PROGRAM = "exported_program"
    TORCH_FACTORY = "torch_factory"


class ArtifactStatus(_Word):
    """Why an artifact is (not) the preferred one: within tolerance and faster, or what it failed."""

    OK = "ok"
    SLOWER = "slower"  # ships, never preferred: measurably slower than fp32, paired, on a profile that IS this host
    OUT_OF_TOLERANCE = "out_of_tolerance"
    NO_SPEEDUP_MEASURED = "no_speedup_measured"  # inside the noise of fp32, or timed on a CPU it will not run on
    UNVERIFIED = "unverified"  # ships; verification proved nothing (Verification.vacuous says why)


class IoDtype(_Word):
    FLOAT32 = "float32"
    INT8 = "int8"
    UINT8 = "uint8"


class QuantType(_Word):
    """Static INT8: the type of activations and weights. ``int16`` is an activation type only: the A16W8
    recipe (16-bit activations, 8-bit weights) for models whose activations 8 bits cannot hold."""

    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"


# The oldest onnxruntime that runs int16 Q/DQ (A16W8 ONNX: com.microsoft QuantizeLinear/DequantizeLinear below
# opset 21): 1.17.3 loads and runs the BlazeFace A16W8 artifact with outputs identical to 1.31's; 1.16.3
# refuses it ("Type 'tensor(int16)' of input parameter ... of operator (QuantizeLinear) ... is invalid").
A16W8_MIN_ONNXRUNTIME = "1.17"


class CalibrationMethod(_Word):
    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class QuantFormat(_Word):
    QDQ = "qdq"
    QOPERATOR = "qoperator"


class Layout(_Word):
    NCHW = "NCHW"
    NHWC = "NHWC"


class AttemptOutcome(_Word):
    KEPT = "kept"
    DROPPED = "dropped"
    FAILED = "failed"


PRECISIONS: tuple[str, ...] = Precision.values()
FORMATS: tuple[str, ...] = Format.values()
RUNTIMES: tuple[str, ...] = Runtime.values()
TFLITE_RUNTIMES: tuple[str, ...] = tuple(r.value for r in (Runtime.LITERT, Runtime.TFLITE_RUNTIME, Runtime.TENSORFLOW))


class AcceleratorKind(_Word):
    """What kind of accelerator a target profile's ``[[accelerators]]`` entry is."""

    GPU = "gpu"
    EDGETPU = "edgetpu"
    NPU = "npu"
    DSP = "dsp"


class TensorRole(_Word):
    """Which side of a model a tensor is on."""

    INPUT = "input"
    OUTPUT = "output"


class FloatIOReason(_Word):
    """Why an INT8 artifact's input or output stayed float although its recipe asks for integer I/O."""

    NO_RANGE = "no_range"  # the calibration recorded no range for it, so it has no int8 scale
    MIXED_RANGES = "mixed_ranges"  # it carries quantities of ranges far apart (boxes and scores): one scale flattens
    # the small ones, so the island of float ops that fixes them has to reach the output
    FLOAT_NEIGHBOUR = "float_neighbour"  # the layer that reads or writes it is kept in float (no int8 tensor there)



class HelperRefusal(_Word):
    """Why the device helper refused a step: the ``kind`` of its answer when it exits 3. The device side
    (``toolkit/device_side/src/device_helper.py``'s ``fail``, and the boot program's ``helper_missing``) writes the
    plain words; the host parses them once, where it reads the answer (``toolkit.delivery.deployment``)."""

    HELPER_MISSING = "helper_missing"  # the helper with this host's hash is not installed: install it, ask again
    USAGE = "usage"  # bad arguments, a name or path refused
    ARCH = "arch"  # the bundle is built for another arch than the device's
    LOCKED = "locked"  # another push, rollback or removal holds the bundle's lock
    DISK_FULL = "disk_full"
    OS_ERROR = "os_error"
    INTEGRITY = "integrity"  # a file's sha256 is not the expected one
    CUT = "cut"  # the stream of files ended early
    NOT_INSTALLED = "not_installed"  # the bundle is not on the device
    NO_PREVIOUS = "no_previous"  # rollback: no earlier version to go back to
    NOT_CURRENT = "not_current"  # select: the selection is for another version than the installed one


class RunnerErrorKind(_Word):
    """Why the runner could not measure an artifact (its ``error.kind``; the runner writes these words from its
    own ERROR_KINDS, a test keeps the two the same)."""

    MISSING_RUNTIME = "missing_runtime"
    UNSUPPORTED_OP = "unsupported_op"
    CORRUPT_ARTIFACT = "corrupt_artifact"
    INTEGRITY = "integrity"  # a file's sha256 is not the installed manifest's: not used
    CRASH = "crash"
    BAD_BUNDLE = "bad_bundle"
    USAGE = "usage"
    OUT_OF_MEMORY = "out_of_memory"  # MemoryError, std::bad_alloc, ulimit -v, an OOM kill (docs/devices.md)
    KILLED = "killed"  # killed by a signal that was no crash of the runtime (SIGKILL without an OOM kill)
    BAD_REPORT = "bad_report"  # the host's: a figure no real run gives (toolkit.model.runner_report)


def artifact_file_name(precision: str, fmt: str) -> str:
    """The contract's artifact name: ``model.<precision>.<tflite|onnx|pte>``."""
    return f"model.{precision}.{fmt}"

