"""Records read back from their JSON objects: the frozen dataclass is the schema.

``read_record(Manifest, data, docs=...)`` checks ``data`` against the record's own fields (names, type hints,
defaults) and builds the record, or raises :class:`RecordProblem` with a :class:`Problem` that names the key
(``artifacts[0].bytes``), what is wrong and the fix. A record's JSON shape is so written once, in its class: its
``to_dict`` writes it, this reads it. The rules:

- unknown keys are refused, except a key the record derives (a property of its class: ``max_error_ratio``,
  ``ok``, ``mixed``), which the writer adds for other readers and the record recomputes;
- a key that is absent or null takes the field's default; null in a float field is NaN (JSON has no NaN:
  :func:`~toolkit.model.records.finite_or_none` wrote it as null); ``{}`` in an optional record field is None
  (an artifact taken as it was has no recipe, written ``{}``);
- strings, integers (not booleans), numbers (integers too) and booleans are never converted into each other; a
  vocabulary field takes one of its words; a tuple takes a list; a free-form ``JsonObject`` takes any object;
- the rules a record keeps itself (its ``__post_init__``) raise their own UsageError.

Stdlib only: a bundle is read without pydantic.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from toolkit.model.schemas.problems import Problem, describe, did_you_mean, toml_type

R = TypeVar("R")
Path = tuple[str | int, ...]  # the keys and list indices from the document's root

_NONE = type(None)
_HINTS: dict[type, dict[str, Any]] = {}  # Any: resolved type expressions, walked below


class RecordProblem(Exception):
    """What is wrong with the document, as one :class:`Problem` (the first found: unknown keys before missing)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def read_record(cls: type[R], data: object, *, docs: str, at: Path = ()) -> R:
    """``data`` (parsed JSON or TOML) as a ``cls`` record; ``docs`` is the page the fixes point at, ``at`` where
    ``data`` sits in its file (``("recipes", 0)``: keys are named ``recipes[0].format``)."""
    return typing.cast(R, _Reader(docs).record(cls, data, at))


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _key(path: Path) -> str:
    key = ""
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else part)
    return key


def _leaf(path: Path) -> str:
    names = [p for p in path if isinstance(p, str)]
    return names[-1] if names else ""


def _scalar(tp: Any) -> bool:  # Any: a type expression
    return not (typing.get_origin(tp) in (tuple, Mapping, dict) or dataclasses.is_dataclass(tp))


class _Reader:
    def __init__(self, docs: str) -> None:
        self.docs = docs

    def record(self, cls: type, data: object, path: Path) -> object:
        if not isinstance(data, Mapping):
            raise self._wrong(cls, data, path)
        fields = [f for f in dataclasses.fields(cls) if f.init]
        names = [f.name for f in fields]
        for key in data:
            if key not in names and not isinstance(getattr(cls, str(key), None), property):
                raise self._unknown(str(key), names, path)
        hints, values = _hints(cls), {}
        for f in fields:
            optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            value = data.get(f.name)
            if value is None and optional:
                continue
            if f.name not in data:
                raise self._missing((*path, f.name))
            values[f.name] = self.value(hints[f.name], value, (*path, f.name))
        return cls(**values)

    def value(self, tp: Any, value: object, path: Path) -> object:  # Any: a type expression
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            inner = [a for a in args if a is not _NONE]
            if len(inner) != 1:
                raise TypeError(f"a record field of type {tp} has no JSON reading")
            if _NONE in args and (value is None or (value == {} and dataclasses.is_dataclass(inner[0]))):
                return None
            return self.value(inner[0], value, path)
        if tp is Any or tp is object:
            return value
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.record(tp, value, path)
        if origin is tuple:
            return self._tuple(tp, args, value, path)
        if origin in (Mapping, dict):
            if not isinstance(value, Mapping):
                raise self._wrong(tp, value, path)
            return {str(k): self.value(args[1], v, (*path, str(k))) for k, v in value.items()}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self._word(tp, value, path)
        if tp is float and value is None:
            return math.nan
        if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if (tp is int and isinstance(value, int) and not isinstance(value, bool)) or (
                tp in (str, bool) and isinstance(value, tp)):
            return value
        raise self._wrong(tp, value, path)

    def _tuple(self, tp: Any, args: tuple[Any, ...], value: object, path: Path) -> tuple[object, ...]:  # Any: as value
        if not isinstance(value, list):
            raise self._wrong(tp, value, path)
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            raise self._wrong(tp, value, path, expected=f"a list of {len(items)} values")
        out = []
        for i, (item, v) in enumerate(zip(items, value)):
            try:
                out.append(self.value(item, v, (*path, i)))
            except RecordProblem:
                if not _scalar(item):
                    raise
                raise self._wrong(tp, v, path) from None  # a list of scalars: name the list, show the item
        return tuple(out)

    def _word(self, vocabulary: type[enum.Enum], value: object, path: Path) -> enum.Enum:
        choices = [str(m.value) for m in vocabulary]
        if isinstance(value, str) and value in choices:
            return vocabulary(value)
        key = _key(path)
        raise RecordProblem(Problem("choice", "", key, f"key {key!r}: unknown {_leaf(path)} {value!r}"
                                    f"{did_you_mean(str(value), choices)}.", f"Use one of: {', '.join(choices)}."))

    def _unknown(self, name: str, keys: list[str], path: Path) -> RecordProblem:
        key, top = _key((*path, name)), "" if path else "top-level "
        what = "this table" if path else "the file"
        return RecordProblem(Problem("extra_forbidden", "", key, f"unknown {top}key {key!r}{did_you_mean(name, keys)}.",
                                     f"Rename or remove it; the keys {what} takes are: {', '.join(keys)} ({self.docs})."))

    def _missing(self, path: Path) -> RecordProblem:
        key = _key(path)
        return RecordProblem(Problem("missing", "", key, f"the key {key!r} is missing.",
                                     f"Add {_leaf(path)} = ... ({self.docs} describes it)."))

    def _wrong(self, tp: Any, value: object, path: Path, *, expected: str = "") -> RecordProblem:  # Any: as value
        expected, key = expected or describe(tp), _key(path)
        if not key:
            return RecordProblem(Problem("type", "", "", f"expected {expected}, got {toml_type(value)}.",
                                         f"See {self.docs}."))
        return RecordProblem(Problem("type", "", key, f"the key {key!r} must be {expected}, got {toml_type(value)} "
                                     f"({value!r}).", f"Write {_leaf(path)} as {expected} ({self.docs})."))
