"""Frozen data that flows between the stages: convert -> bundle -> deploy -> check -> history.

Stdlib only, so that every stage (and the CLI's ``--help``) can import it for free. Each class that is written
to disk or printed as JSON has ``to_dict``; ``toolkit.model.schemas.manifest.read_manifest`` reads a manifest back
through its schema (pydantic, imported only when a bundle is read), which refuses malformed input with a :class:`~toolkit.errors.UsageError`
naming the file and the key, so a hand-edited or corrupt manifest never turns into a traceback deep in another
stage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from toolkit.errors import UsageError
from toolkit.model.batching import BatchVerification
from toolkit.model.records import OutputMetrics, SliceCheck
from toolkit.model.policy import CheckPolicy
from toolkit.model.quantized import QuantizedShare

# --------------------------------------------------------------------------------------------- vocabularies


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
FRAMEWORKS: tuple[str, ...] = Framework.values()
FORMAT_SUFFIX: Mapping[str, str] = {fmt: f".{fmt}" for fmt in Format}

MANIFEST_SCHEMA_VERSION = 4  # 2: attempts[].workaround, artifacts[].float_io and .batching; 3: on_demand (the
# eval set and layer probes, hashed); 4: a role per verified output (verification.outputs[].role, role_source,
# metrics); 1 to 3 still read


def artifact_file_name(precision: str, fmt: str) -> str:
    """The contract's artifact name: ``model.<precision>.<tflite|onnx|pte>``."""
    return f"model.{precision}.{fmt}"


# --------------------------------------------------------------------------------------------- helpers


def _coerce(obj: Any, **vocabularies: type[_Word]) -> None:
    """Store each named field of a frozen dataclass as its enum member (plain strings accepted)."""
    for key, vocabulary in vocabularies.items():
        value = getattr(obj, key)
        try:
            object.__setattr__(obj, key, vocabulary(value))
        except ValueError:
            raise UsageError(f"{type(obj).__name__}: unknown {key} {value!r}.",
                             hint=f"Use one of: {', '.join(vocabulary.values())}.") from None


def _finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/Inf; metrics that are not finite are written as null."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


# --------------------------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class Quantization:
    """Affine quantization of one tensor: ``real = scale * (q - zero_point)``; per-axis when ``axis`` is set."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"scale": list(self.scale), "zero_point": list(self.zero_point), "axis": self.axis}


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (None for a dynamic dimension) and dtype (numpy name) of a model input or output."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str
    quantization: Quantization | None = None

    @property
    def is_static(self) -> bool:
        return all(d is not None and d >= 0 for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "quantization": self.quantization.to_dict() if self.quantization else None,
        }


# --------------------------------------------------------------------------------------------- recipes

class RecipeError(UsageError):
    """A recipe refused by :class:`Recipe`; ``key`` is the field at fault, so a profile loader can name it
    without reading the message."""

    def __init__(self, key: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key = key


def _word(vocabulary: type[_Word], value: Any, key: str) -> Any:
    try:
        return vocabulary(value)
    except ValueError:
        choices = vocabulary.values()
        last = " or ".join(choices[-2:])
        hint = f"Use one of: {', '.join(choices)}." if len(choices) > 3 else f"Use {', '.join([*choices[:-2], last])}."
        raise RecipeError(key, f"Unknown {key} {value!r}.", hint=hint) from None


@dataclass(frozen=True)
class Recipe:
    """How to build one artifact: format and precision, plus the knobs that decide whether it is fast.

    Target profiles list recipes in order of preference; ``--precision``/``--format`` build plain ones.
    ``__post_init__`` refuses a recipe its format cannot express, so a wrong one never reaches a converter.
    """

    # Each vocabulary field is stored as its enum member; ``| str`` because a plain string is accepted (and
    # converted in __post_init__), so callers that pass "int8" stay well typed.
    format: Format | str
    precision: Precision | str
    io_dtype: IoDtype | str = IoDtype.FLOAT32  # TFLite int8: the input/output type ("int8" for int8 recipes)
    activation_type: QuantType | str = QuantType.UINT8  # ONNX static int8: U8S8 2x faster than S8S8 on x86
    weight_type: QuantType | str = QuantType.INT8
    calibration_method: CalibrationMethod | str = CalibrationMethod.MINMAX
    per_channel: bool = True
    quant_format: QuantFormat | str = QuantFormat.QDQ
    threads: int | None = None
    opset: int | None = None
    nodes_to_exclude: tuple[str, ...] = ()  # selective quantization: kept in float
    execution_providers: tuple[str, ...] = ()  # ONNX Runtime providers for the device, in order
    layout: Layout | str | None = None  # "NHWC" to ask a PyTorch -> TFLite route for channel-last I/O

    def __post_init__(self) -> None:
        # Plain strings are accepted (from files, flags, older callers) and stored as their enum member; a word
        # outside the vocabulary raises a UsageError that names the key (``RecipeError.key``).
        for key, vocabulary in _RECIPE_WORDS.items():
            value = getattr(self, key)
            if value is None and key == "layout":
                continue
            object.__setattr__(self, key, _word(vocabulary, value, key))
        if self.io_dtype != IoDtype.FLOAT32 and not (self.format == Format.TFLITE and self.precision == Precision.INT8):
            raise RecipeError(
                "io_dtype",
                f"io_dtype {self.io_dtype!r} needs a full-integer TFLite recipe (got {self.format} {self.precision}).",
                hint="Only TFLite int8 artifacts take integer input/output; leave io_dtype at float32.",
            )
        if self.activation_type == QuantType.INT16 or self.weight_type == QuantType.INT16:
            self._check_a16w8()
        if self.threads is not None and self.threads < 1:
            raise RecipeError("threads", f"threads must be at least 1 (got {self.threads}).")

    def _check_a16w8(self) -> None:
        """int16 is the activation type of the A16W8 recipe only: an int8 recipe with int8 weights, QDQ in ONNX
        (ONNX Runtime's only 16-bit format), float I/O in TFLite (the 16x8 converter's inputs stay float)."""
        hint = ('For A16W8 write precision = "int8", activation_type = "int16", weight_type = "int8" '
                '(quant_format = "qdq" in ONNX, io_dtype = "float32" in TFLite).')
        if self.weight_type == QuantType.INT16:
            raise RecipeError("weight_type", "weight_type 'int16' is not offered: 16 bits are for activations "
                              "(A16W8).", hint=hint)
        if self.precision != Precision.INT8:
            raise RecipeError("activation_type", f"activation_type 'int16' needs precision int8 (got "
                              f"{self.precision}).", hint=hint)
        if self.weight_type != QuantType.INT8:
            raise RecipeError("weight_type", f"A16W8 takes int8 weights (got {self.weight_type}).", hint=hint)
        if self.format == Format.ONNX and self.quant_format != QuantFormat.QDQ:
            raise RecipeError("quant_format", "16-bit activations exist in ONNX Runtime only as QDQ (got "
                              f"{self.quant_format}).", hint=hint)
        if self.format == Format.TFLITE and self.io_dtype != IoDtype.FLOAT32:
            raise RecipeError("io_dtype", f"A16W8 TFLite takes float32 input/output (got {self.io_dtype}).",
                              hint=hint)

    @property
    def a16w8(self) -> bool:
        """16-bit activations, 8-bit weights: the accuracy fallback after plain INT8 (never preferred to it)."""
        return self.precision == Precision.INT8 and self.activation_type == QuantType.INT16

    @property
    def label(self) -> str:
        """A short human name: ``tflite int8 (int8 io)``, ``onnx int8 (U8S8 qdq minmax)``, ``onnx int8 (A16W8 qdq
        minmax)``, ``tflite int8 (A16W8, float32 io)``."""
        if self.precision != "int8":
            return f"{self.format} {self.precision}"
        if self.format == "tflite":
            return f"tflite int8 ({'A16W8, ' if self.a16w8 else ''}{self.io_dtype} io)"
        if self.format == "pte":
            return f"pte int8 (XNNPACK, {'per-channel' if self.per_channel else 'per-tensor'} weights)"
        if self.a16w8:
            return f"onnx int8 (A16W8 {self.quant_format} {self.calibration_method})"
        act = "U" if self.activation_type == "uint8" else "S"
        wt = "U" if self.weight_type == "uint8" else "S"
        return f"onnx int8 ({act}8{wt}8 {self.quant_format} {self.calibration_method})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "precision": self.precision,
            "io_dtype": self.io_dtype,
            "activation_type": self.activation_type,
            "weight_type": self.weight_type,
            "calibration_method": self.calibration_method,
            "per_channel": self.per_channel,
            "quant_format": self.quant_format,
            "threads": self.threads,
            "opset": self.opset,
            "nodes_to_exclude": list(self.nodes_to_exclude),
            "execution_providers": list(self.execution_providers),
            "layout": self.layout,
        }


def is_a16w8(recipe: Mapping[str, Any]) -> bool:
    """A written recipe (a manifest's ``recipe`` object) is the A16W8 recipe: 16-bit activations, 8-bit weights."""
    return recipe.get("precision") == Precision.INT8 and recipe.get("activation_type") == QuantType.INT16


_RECIPE_WORDS: Mapping[str, type[_Word]] = {
    "format": Format, "precision": Precision, "io_dtype": IoDtype, "activation_type": QuantType,
    "weight_type": QuantType, "calibration_method": CalibrationMethod, "quant_format": QuantFormat,
    "layout": Layout,
}


# --------------------------------------------------------------------------------------------- verification


@dataclass(frozen=True)
class Verification:
    """An artifact's outputs against the float model's, on held-out inputs the calibration never saw."""

    max_abs_error: float
    mean_abs_error: float
    cosine_similarity: float
    top1_agreement: float | None  # None when the outputs are not a classifier's
    samples: int
    accuracy: float | None = None  # against labels (eval data key `y`), when given
    reference_accuracy: float | None = None  # the float model's accuracy on the same labels
    # toolkit.verification: the task the metrics were chosen for and how (--task, dataset.toml, inferred),
    # its metrics (recall, mask IoU, ...), every output (and slice) against its float range, the worst one
    # named, why the verdict proves nothing when it does not, and a --metric's result
    task: str | None = None
    task_source: str | None = None
    task_metrics: Mapping[str, Any] = field(default_factory=dict, hash=False)
    outputs: tuple[OutputMetrics, ...] = ()
    worst: str | None = None
    vacuous: str | None = None
    user_metric: Mapping[str, Any] | None = field(default=None, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_abs_error": _finite_or_none(self.max_abs_error),
            "mean_abs_error": _finite_or_none(self.mean_abs_error),
            "cosine_similarity": _finite_or_none(self.cosine_similarity),
            "top1_agreement": _finite_or_none(self.top1_agreement),
            "samples": self.samples,
            "accuracy": _finite_or_none(self.accuracy),
            "reference_accuracy": _finite_or_none(self.reference_accuracy),
            "task": self.task,
            "task_source": self.task_source,
            "task_metrics": {k: _finite_or_none(v) if isinstance(v, float) else v for k, v in self.task_metrics.items()},
            "outputs": [o.to_dict() for o in self.outputs],
            "worst": self.worst,
            "vacuous": self.vacuous,
            "user_metric": dict(self.user_metric) if self.user_metric is not None else None,
        }


@dataclass(frozen=True)
class Golden:
    """Where the runner finds the outputs this artifact gave on the host, and how close the device must be."""

    outputs: str  # bundle-relative .npz path, keyed by output name
    atol: float
    # slices of outputs that mix ranges (box coordinates and scores), compared on the device against the
    # float reference (``reference``, bundle-relative) with the tolerance's per-slice limit
    slices: tuple[SliceCheck, ...] = ()
    reference: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outputs": self.outputs, "atol": self.atol}
        if self.slices:
            out["slices"] = [s.to_dict() for s in self.slices]
            out["reference"] = self.reference
        return out


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


@dataclass(frozen=True)
class FloatIO:
    """An input or output of an INT8 artifact that is float32 where the recipe asked for int8/uint8 I/O."""

    name: str  # the source's input/output name
    role: TensorRole | str
    reason: FloatIOReason | str
    detail: str = ""  # the same in words, for people

    def __post_init__(self) -> None:
        _coerce(self, role=TensorRole, reason=FloatIOReason)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class PteRecord:
    """What an ExecuTorch artifact carries beside its file: how much of its graph the XNNPACK delegate took
    (edge-dialect operator nodes, counted before lowering) and the bundled program (``model.<p>.bpte``: a few
    held-out inputs with the float model's outputs) the device checks its own numbers with, at ``bundled_atol``
    (twice the error measured here on those inputs plus float rounding: ``conversion.pte_bundled``)."""

    delegated_nodes: int
    total_nodes: int
    bundled: str | None = None
    bundled_atol: float | None = None

    @property
    def delegated_share(self) -> float:
        return self.delegated_nodes / self.total_nodes if self.total_nodes else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"delegated_nodes": self.delegated_nodes, "total_nodes": self.total_nodes,
                "delegated_share": round(self.delegated_share, 4), "bundled": self.bundled,
                "bundled_atol": self.bundled_atol}


@dataclass(frozen=True)
class ArtifactRecord:
    """One converted (or taken as-is) model file inside a bundle, with everything proven about it."""

    file: str
    format: Format | str  # stored as the member; plain strings accepted (as in Recipe)
    precision: Precision | str
    sha256: str
    bytes: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    verification: Verification | None
    golden: Golden | None = None
    host_latency_ms: float | None = None  # median on this host, in `runtime`
    fp32_latency_ms: float | None = None  # the fp32 artifact of the same format, same runtime, same run
    host_cpu: str | None = None  # the CPU the host latencies were measured on (they inform only that CPU)
    runtime: str | None = None
    status: ArtifactStatus | str = ArtifactStatus.OK
    recipe: Mapping[str, Any] = field(default_factory=dict)
    float_nodes: tuple[str, ...] = ()  # nodes/ops kept in float by selective quantization
    execution_providers: tuple[str, ...] = ()  # ONNX Runtime providers the device should try, in order
    layout: str | None = None  # NCHW/NHWC of the artifact's image inputs, when it differs from the source's
    notes: tuple[str, ...] = ()
    # The artifact the device should run for this format: within the tolerance, not slower than fp32, first in
    # the profile's (or the user's) order of preference. At most one per format; none when every one failed.
    preferred: bool = False
    # ONNX Runtime options per provider (from the target profile), passed with each provider the device has.
    provider_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    delegate: str | None = None  # a TFLite delegate the artifact needs (``libedgetpu.so.1`` for Edge TPU models)
    # I/O that stayed float in an INT8 artifact whose recipe asks for integer I/O, and why (none: as asked)
    float_io: tuple[FloatIO, ...] = ()
    # A dynamic-batch artifact's outputs per sample at batch 4 and 8 against batch 1 (None: batch not dynamic)
    batching: BatchVerification | None = None
    # An int8/dynamic artifact's share of weights and MACs computed in integer, read from the file (None:
    # not quantized, or written before it was recorded); below half of the weights it is labelled mixed
    quantized: QuantizedShare | None = None
    pte: PteRecord | None = None  # ExecuTorch artifacts: delegated share and bundled self-check

    def __post_init__(self) -> None:
        _coerce(self, format=Format, precision=Precision, status=ArtifactStatus)

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "format": self.format,
            "precision": self.precision,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "verification": self.verification.to_dict() if self.verification else None,
            "golden": self.golden.to_dict() if self.golden else None,
            "host_latency_ms": _finite_or_none(self.host_latency_ms),
            "fp32_latency_ms": _finite_or_none(self.fp32_latency_ms),
            "host_cpu": self.host_cpu,
            "runtime": self.runtime,
            "status": self.status,
            "recipe": dict(self.recipe),
            "float_nodes": list(self.float_nodes),
            "execution_providers": list(self.execution_providers),
            "layout": self.layout,
            "notes": list(self.notes),
            "preferred": self.preferred,
            "provider_options": {k: dict(v) for k, v in self.provider_options.items()},
            "delegate": self.delegate,
            "float_io": [f.to_dict() for f in self.float_io],
            "batching": self.batching.to_dict() if self.batching else None,
            "quantized": self.quantized.to_dict() if self.quantized else None,
            **({"pte": self.pte.to_dict()} if self.pte else {}),
        }


@dataclass(frozen=True)
class Attempt:
    """One recipe the convert stage tried, and why its artifact was kept, dropped or never built."""

    recipe: Mapping[str, Any]
    outcome: AttemptOutcome | str
    reason: str
    file: str | None = None
    metrics: Mapping[str, Any] | None = None
    workaround: str | None = None  # what the user can do about it, when the recipe failed or was dropped

    def __post_init__(self) -> None:
        _coerce(self, outcome=AttemptOutcome)

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": dict(self.recipe),
            "outcome": self.outcome,
            "reason": self.reason,
            "workaround": self.workaround,
            "file": self.file,
            "metrics": dict(self.metrics) if self.metrics is not None else None,
        }


# --------------------------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class SourceRef:
    path: str
    sha256: str
    framework: Framework | str

    def __post_init__(self) -> None:
        _coerce(self, framework=Framework)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "framework": self.framework}


@dataclass(frozen=True)
class CalibrationRef:
    path: str
    sha256: str
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "samples": self.samples}


@dataclass(frozen=True)
class Preprocessing:
    """How raw data becomes the model's input: ``x = (raw * scale - mean) / std`` in ``layout``/``color_order``."""

    layout: str | None = None  # "NHWC" | "NCHW"
    color_order: str | None = None  # "RGB" | "BGR" | "GRAY"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    scale: float | None = None
    dtype: str | None = None
    size: tuple[int, int] | None = None  # (height, width) images are resized to

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "color_order": self.color_order,
            "mean": list(self.mean) if self.mean is not None else None,
            "std": list(self.std) if self.std is not None else None,
            "scale": self.scale,
            "dtype": self.dtype,
            "size": list(self.size) if self.size is not None else None,
        }


@dataclass(frozen=True)
class RunnerRef:
    file: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256}


@dataclass(frozen=True)
class FileRef:
    """A bundle file with its hash and size (``on_demand``: pushed only when a check asks, verified where read)."""

    file: str
    sha256: str
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "bytes": self.bytes}


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: the contract between convert, deploy and check (architecture.md)."""

    name: str
    created_at: str
    toolkit_version: str
    source: SourceRef
    target: str | None
    artifacts: tuple[ArtifactRecord, ...]
    golden_inputs: str | None = None  # bundle-relative .npz keyed by input name, samples along axis 0
    preprocessing: Preprocessing | None = None
    labels: tuple[str, ...] | None = None
    calibration: CalibrationRef | None = None
    runner: RunnerRef | None = None
    attempts: tuple[Attempt, ...] = ()
    target_arch: str | None = None  # the profile's arch: deploy refuses a device of another arch
    runtime_preferences: Mapping[str, Any] = field(default_factory=dict)  # from the target profile
    config: Mapping[str, Any] = field(default_factory=dict)  # the effective options, replayable
    schema_version: int = MANIFEST_SCHEMA_VERSION
    check_policy: CheckPolicy | None = None  # what check gates on (budget, regression, placement); None: old bundle
    on_demand: tuple[FileRef, ...] = ()  # eval/ and layers/: deploy leaves them out (toolkit.delivery.on_demand)

    def preferred_artifacts(self) -> tuple[ArtifactRecord, ...]:
        """The artifacts marked preferred (at most one per format), in manifest order."""
        return tuple(record for record in self.artifacts if record.preferred)

    def artifact(self, file: str) -> ArtifactRecord:
        for record in self.artifacts:
            if record.file == file:
                return record
        raise UsageError(f"The bundle {self.name!r} has no artifact {file!r}.")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "created_at": self.created_at,
            "toolkit_version": self.toolkit_version,
            "source": self.source.to_dict(),
            "target": {"name": self.target, "arch": self.target_arch},
            "preprocessing": self.preprocessing.to_dict() if self.preprocessing else None,
            "labels": list(self.labels) if self.labels is not None else None,
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "golden_inputs": self.golden_inputs,
            "artifacts": [a.to_dict() for a in self.artifacts],
            "attempts": [a.to_dict() for a in self.attempts],
            "runtime_preferences": dict(self.runtime_preferences),
            "runner": self.runner.to_dict() if self.runner else None,
            "config": dict(self.config),
            "check_policy": self.check_policy.to_dict() if self.check_policy else None,
            "on_demand": [f.to_dict() for f in self.on_demand],
        }


# --------------------------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class CommandResult:
    """What a command run on a device returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass(frozen=True)
class LatencyStats:
    mean: float
    std: float
    min: float
    p50: float
    p90: float
    p99: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in ("mean", "std", "min", "p50", "p90", "p99", "max")}


@dataclass(frozen=True)
class GateResult:
    """The verdict of a check's gates: ``failures`` (each one line naming the artifact and the fix) fail it;
    ``skipped`` notes say which gate could not run and why (no budget, too few baseline checks) and do not.
    ``details`` carries what the gates computed (``regression``: the statistics; ``placement``) for reports.
    """

    passed: bool
    failures: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.passed == bool(self.failures):
            raise ValueError("GateResult: passed must be True exactly when there are no failures")

    @property
    def reasons(self) -> tuple[str, ...]:
        """The failures (the check report's ``gates.reasons`` key, kept for the JSON contract)."""
        return self.failures

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reasons": list(self.failures), "skipped": list(self.skipped),
                "details": dict(self.details)}


@dataclass(frozen=True)
class CheckReport:
    """One artifact measured on one device by the runner, then gated (architecture.md's check report)."""

    device: str
    artifact: str
    runtime: Mapping[str, Any]  # {"name", "version"}
    threads: int | None
    load_ms: float | None
    first_inference_ms: float | None
    latency_ms: LatencyStats | None
    runs: int
    warmup: int
    peak_rss_mb: float | None
    outputs_match: Mapping[str, Any] | None  # {"max_abs_error", "top1_agreement", "ok"}
    environment: Mapping[str, Any]
    gates: GateResult
    error: Mapping[str, Any] | None = None  # {"kind", "message", "hint"} when the runner could not measure
    check_id: str | None = None
    latency_samples_ms: tuple[float, ...] = ()  # every timed run, kept in the history for regression tests
    placement: Mapping[str, Any] | None = None  # where the nodes ran (the runner's ``placement``), when reported
    # measured on request (check --profile / --throughput / --loads; docs/runner.md has their shapes)
    profile: Mapping[str, Any] | None = None  # per-operator times per op type and top nodes, profiler overhead
    throughput: Mapping[str, Any] | None = None  # the latency-throughput curve (batch sizes or requests in flight)
    loads: Mapping[str, Any] | None = None  # cold / warm loads with the first inference, load options before/after
    throttled: str | None = None  # why the device was throttling during the run (toolkit.checks.selection.throttled)
    # check --eval: the eval set on the device, scored against the labels and the float model (toolkit.checks.device_eval)
    evaluation: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "check_id": self.check_id,
            "device": self.device,
            "artifact": self.artifact,
            "runtime": dict(self.runtime),
            "threads": self.threads,
            "load_ms": self.load_ms,
            "first_inference_ms": self.first_inference_ms,
            "latency_ms": self.latency_ms.to_dict() if self.latency_ms else None,
            "runs": self.runs,
            "warmup": self.warmup,
            "peak_rss_mb": self.peak_rss_mb,
            "outputs_match": dict(self.outputs_match) if self.outputs_match is not None else None,
            "environment": dict(self.environment),
            "gates": self.gates.to_dict(),
            "error": dict(self.error) if self.error is not None else None,
            "placement": dict(self.placement) if self.placement is not None else None,
            "latency_samples_ms": list(self.latency_samples_ms),
            "profile": dict(self.profile) if self.profile is not None else None,
            "throughput": dict(self.throughput) if self.throughput is not None else None,
            "loads": dict(self.loads) if self.loads is not None else None,
            "throttled": self.throttled,
            "evaluation": dict(self.evaluation) if self.evaluation is not None else None,
        }


def tensor_specs_to_list(specs: Sequence[TensorSpec]) -> list[dict[str, Any]]:
    return [s.to_dict() for s in specs]
