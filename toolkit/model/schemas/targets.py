"""The field types of a target profile file (``targets/*.toml``, docs/targets.md): its vocabularies, bounds and
small tables. The profile's shape is :class:`toolkit.model.targets.TargetProfile` itself, read by the one engine
for records (:mod:`toolkit.model.reading`): each file on its own (keys, types, values; a key the file leaves out
may come from the profile it ``extends``), then the merged profile, where a required key that is still missing
is an error. The cross-checks that need several keys (an ONNX recipe needs onnxruntime, an Edge TPU profile
must prefer full-integer TFLite, ...) stay in :mod:`toolkit.model.targets`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from toolkit.model.platform import EXECUTION_PROVIDERS
from toolkit.model.reading import Rule, Words
from toolkit.model.records import Record
from toolkit.model.vocabulary import PRECISIONS, Precision

DOCS = "docs/targets.md"


def _is_version(text: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _is_pattern(text: str) -> bool:
    try:
        re.compile(text)
    except re.error:
        return False
    return True


def matching(pattern: str, what: str, fix: str) -> Rule:
    compiled = re.compile(pattern)
    return Rule(lambda v: bool(compiled.match(v)), lambda v: f"{v!r} is not {what}", fix)


def nonempty(what: str, fix: str) -> Rule:
    return Rule(bool, lambda v: f"the profile lists no {what}", fix)


PositiveInt = Annotated[int, Rule(lambda v: v >= 1, lambda v: f"must be at least 1 (got {v})",
                                  "Use a positive integer.")]
Provider = Annotated[str, Words(EXECUTION_PROVIDERS, "execution provider")]
Version = Annotated[str, Rule(_is_version, lambda v: f"{v!r} is not a version",
                              'Write it as a PEP 440 version, e.g. "2.14" or "1.16.3".')]
PrecisionWord = Annotated[Precision, Words(PRECISIONS, "precision")]
Pattern = Annotated[str, Rule(_is_pattern, lambda v: f"{v!r} is not a regular expression",
                              'Write a Python regular expression, e.g. "raspberry pi 4".')]
ProfileName = Annotated[str, matching(r"^[a-z0-9][a-z0-9._-]*$", "a valid profile name",
                                      "Use lower case letters, digits, '.', '_' and '-'.")]
PythonVersion = Annotated[str, matching(r"^3\.\d+$", "a Python version", 'Write it as "3.11".')]
# ONNX Runtime takes provider options as scalars.
OptionValue = Annotated[object, Rule(lambda v: isinstance(v, (str, int, float, bool)),
                                     lambda v: "must be a string, number or boolean",
                                     "ONNX Runtime takes provider options as scalars.")]


@dataclass(frozen=True)
class Cpu(Record):
    """``[cpu]``: the device's CPU."""

    cores: Annotated[int, Rule(lambda v: v >= 1, lambda v: f"must be at least 1 (got {v})",
                               "Use the number of CPU cores.")]
    model: str


@dataclass(frozen=True)
class Match(Record):
    """``[match]``: what picks this profile for a probed device (:func:`toolkit.model.platform.match_profile`)."""

    boards: tuple[Pattern, ...] = ()  # searched in the board's own name and the CPU's
    cores: tuple[Pattern, ...] = ()  # a CPU core that on its own names the board
