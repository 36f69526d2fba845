"""The schema of a target profile file (``targets/*.toml``, docs/targets.md).

One model serves both passes of :mod:`toolkit.model.targets`: each file on its own (keys, types, values; a key the
file leaves out may come from the profile it ``extends``), then the merged profile, where a required key
that is still missing is an error. The cross-checks that need several keys (an ONNX recipe needs
onnxruntime, an Edge TPU profile must prefer full-integer TFLite, ...) stay in :mod:`toolkit.model.targets`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator

from toolkit.model.schemas.fields import (
    Bool,
    Int,
    Number,
    PositiveInt,
    Str,
    Table,
    above,
    at_least,
    checked,
    choice,
    matching,
)
from toolkit.model.tolerance import LIMITS
from toolkit.model.platform import ACCELERATOR_KINDS, ARCHES, EXECUTION_PROVIDERS
from toolkit.model.vocabulary import (
    FORMATS,
    PRECISIONS,
    RUNTIMES,
)

DOCS = "docs/targets.md"

def _is_version(text: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


Provider = Annotated[Str, choice(EXECUTION_PROVIDERS, "execution provider")]
Version = Annotated[Str, checked(_is_version, lambda v: f"{v!r} is not a version",
                                 'Write it as a PEP 440 version, e.g. "2.14" or "1.16.3".')]
Precision = Annotated[Str, choice(PRECISIONS, "precision")]


def _is_pattern(text: str) -> bool:
    try:
        re.compile(text)
    except re.error:
        return False
    return True


Pattern = Annotated[Str, checked(_is_pattern, lambda v: f"{v!r} is not a regular expression",
                                 'Write a Python regular expression, e.g. "raspberry pi 4".')]


class Cpu(Table):
    cores: Annotated[Int, at_least(1, "Use the number of CPU cores.")]
    model: Str


def _limited(key: str) -> AfterValidator:
    """The bounds of a ``[tolerance]`` key, from the one table of them (:data:`toolkit.model.tolerance.LIMITS`)."""
    limit = LIMITS[key]
    return checked(limit.admits, lambda v: f"must be {limit.words} (got {v})", limit.fix)


class Tolerance(Table):
    max_top1_drop: Annotated[Number, _limited("max_top1_drop")]
    min_cosine: Annotated[Number, _limited("min_cosine")]
    # optional: the other limits of toolkit.model.tolerance.Tolerance (docs/verification.md)
    max_slice_error: Annotated[Number, _limited("max_slice_error")] | None = None
    min_recall: Annotated[Number, _limited("min_recall")] | None = None
    min_precision: Annotated[Number, _limited("min_precision")] | None = None
    max_label_recall_drop: Annotated[Number, _limited("max_label_recall_drop")] | None = None
    max_label_precision_drop: Annotated[Number, _limited("max_label_precision_drop")] | None = None
    min_mask_iou: Annotated[Number, _limited("min_mask_iou")] | None = None
    min_box_iou: Annotated[Number, _limited("min_box_iou")] | None = None
    min_detection_iou: Annotated[Number, _limited("min_detection_iou")] | None = None
    max_relative_error: Annotated[Number, _limited("max_relative_error")] | None = None
    max_ordinal_error: Annotated[Number, _limited("max_ordinal_error")] | None = None
    min_samples: Annotated[Int, _limited("min_samples")] | None = None


class RuntimeEntry(Table):
    name: Annotated[Str, choice(RUNTIMES, "runtime")]
    min_version: Version | None = None
    max_version: Version | None = None
    note: Str | None = None


class AcceleratorEntry(Table):
    name: Str
    kind: Annotated[Str, choice(ACCELERATOR_KINDS, "accelerator kind")]
    delegate: Str | None = None
    execution_providers: list[Provider] = []
    note: Str | None = None


class Match(Table):
    """``[match]``: what picks this profile for a probed device (:func:`toolkit.model.platform.match_profile`)."""

    boards: list[Pattern] = []  # searched in the board's own name and the CPU's
    cores: list[Pattern] = []  # a CPU core that on its own names the board


class ProfileFile(Table):
    """A whole profile. Required keys (no default) may come from the profile a file ``extends``."""

    name: Annotated[Str, matching(r"^[a-z0-9][a-z0-9._-]*$", "a valid profile name",
                                  "Use lower case letters, digits, '.', '_' and '-'.")] | None = None
    description: Str
    extends: Str | None = None
    arch: Annotated[Str, choice(ARCHES, "arch")]
    cpu: Cpu
    memory_mb: PositiveInt
    os: Str
    python: Annotated[Str, matching(r"^3\.\d+$", "a Python version", 'Write it as "3.11".')]
    runtimes: list[RuntimeEntry]
    accelerators: list[AcceleratorEntry] = []
    execution_providers: list[Provider] | None = None
    provider_options: dict[Provider, dict[Str, Annotated[Any, checked(  # Any: checked scalars
        lambda v: isinstance(v, (str, int, float, bool)), lambda v: "must be a string, number or boolean",
        "ONNX Runtime takes provider options as scalars.")]]] = {}
    max_onnx_opset: PositiveInt | None = None
    recipes: list[dict[str, Any]]  # Any: each table is read by toolkit.model.recipe.Recipe itself (build_recipe)
    threads: PositiveInt
    latency_budget_ms: Annotated[Number, above(0, "Use the budget in milliseconds.")]
    min_throughput_ips: Annotated[Number, above(0, "Use inferences per second.")] | None = None
    tolerance: Tolerance
    fallback: list[Precision]
    edgetpu: Bool = False
    sources: list[Str] = []
    regression: dict[str, Any] | None = None  # Any: read by toolkit.model.policy.RegressionPolicy (read_policies)
    placement: list[dict[str, Any]] = []  # Any: each read by PlacementExpectation
    match: Match | None = None
