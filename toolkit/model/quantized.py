"""How much of a quantized artifact really runs in integer: the record written per artifact to the manifest.

A selective or fragile-op build can keep the layers that hold most of the weights in float (findings.md 6: an
"int8" TFLite with a dense layer of 75% of the weights left float, 0.91x the fp32 file, 1.9x its latency), so
below ``MIXED_BELOW`` of its weights in int8/int16 compute an artifact is labelled ``mixed``, never plain INT8.
``toolkit.runtimes.inspection.share`` reads the figures from the artifact. Stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.model.recipe import Recipe
from toolkit.model.records import JsonDict
from toolkit.model.vocabulary import Precision

MIXED_BELOW = 0.5  # quantized share of the weights under which an int8/dynamic artifact is labelled mixed
LARGE_LAYER = 0.05  # a float layer holding at least this share of the weights (or of the MACs) is listed


LEFT_FLOAT = "left float by the converter"  # a float layer no rule, retry or user asked for
NESTED = "inside an If/Loop/Scan body"  # where ONNX static quantization never reaches (dynamic: initializers only)


@dataclass(frozen=True)
class FloatLayer:
    """A large layer the artifact computes in float, and why it stayed float."""

    name: str  # TFLite: the op's output tensor; ONNX: the node name
    op: str
    weights: float  # share of the model's weights (parameters) it holds
    macs: float  # share of the model's multiply-accumulates
    why: str = LEFT_FLOAT

    def to_dict(self) -> JsonDict:
        return {"name": self.name, "op": self.op, "weights": round(self.weights, 4), "macs": round(self.macs, 4),
                "why": self.why}


@dataclass(frozen=True)
class QuantizedShare:
    """The share of an artifact's weights and multiply-accumulates computed in int8 (or int16).

    Weights count parameters of the weighted layers (convolutions, matmuls, recurrent cells, embeddings),
    whatever their storage width; MACs are estimated per layer from its output shape and weights."""

    weights: float  # quantized share of the weights (0..1)
    macs: float  # quantized share of the multiply-accumulates (0..1)
    quantized_bytes: int  # bytes of the weights stored in integer
    float_bytes: int  # bytes of the weights stored in float (fp32/fp16)
    float_layers: tuple[FloatLayer, ...] = ()  # the large float layers, largest first

    @property
    def mixed(self) -> bool:
        return self.weights < MIXED_BELOW

    def summary(self) -> str:
        """One line: ``62% of weights, 71% of MACs in integer``, with the largest float layer."""
        text = f"{_pct(self.weights)} of weights, {_pct(self.macs)} of MACs in integer"
        if self.float_layers:
            top = self.float_layers[0]
            text += f"; largest float layer {top.name} ({top.op}, {_pct(top.weights)} of weights: {top.why})"
        return text

    def to_dict(self) -> JsonDict:
        return {"weights": round(self.weights, 4), "macs": round(self.macs, 4) if math.isfinite(self.macs) else None,
                "mixed": self.mixed,
                "quantized_bytes": self.quantized_bytes, "float_bytes": self.float_bytes,
                "float_layers": [layer.to_dict() for layer in self.float_layers]}


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{100 * value:.0f}%"


def precision_label(precision: Precision, recipe: Recipe | None, share: QuantizedShare | None) -> str:
    """How every table names an artifact's precision: ``int8``, ``int8 A16W8``, ``int8 mixed: 31% of weights int``."""
    label = f"{precision} A16W8" if recipe is not None and recipe.a16w8 else str(precision)
    if share is not None and share.mixed and precision in (Precision.INT8, Precision.DYNAMIC):
        label += f" mixed: {_pct(share.weights)} of weights int"
    return label


def label_beyond(precision: Precision, recipe: Recipe | None, share: QuantizedShare | None) -> str | None:
    """``precision_label`` where it says more than the precision (``int8 mixed: ...``, ``int8 A16W8``), else None:
    what a text that names the artifact by its file (``model.int8.tflite``) adds after it."""
    label = precision_label(precision, recipe, share)
    return label if label != precision else None


def names_layer(name: str, kept: set[str]) -> bool:
    """A row's layer is kept float when a float node names it (TFLite's float nodes are op names that the
    tensor name extends, or the reverse)."""
    def extends(longer: str, shorter: str) -> bool:  # "linear_1" does not extend "linear": another layer
        rest = longer[len(shorter):]
        return longer.startswith(shorter) and not (rest[:1] == "_" and rest[1:].isdigit())

    return name in kept or any(extends(name, k) or extends(k, name) for k in kept if k)
