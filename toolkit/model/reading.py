"""The one engine for records read from files: the frozen dataclass is the schema.

Every record a file is read into (target profiles, device inventories, ``dataset.toml``, ``run.toml``,
``manifest.json`` and the tables the bundle keeps) goes through :func:`read_record`, which checks ``data`` against
the record's own fields (names, type hints, defaults, and the rules in their ``Annotated`` hints) and builds the
record, or raises :class:`RecordProblem` with a :class:`Problem` that names the table the user wrote
(``[devices.pi-1]``), the key (``recipes[0].io_dtyp``), what is wrong and the fix. The same five messages for
every file: unknown key (with "did you mean"), wrong type, missing key, a word outside its vocabulary, a rule
broken. A record's shape is so written once, in its class. The rules:

- unknown keys are refused, except a key the record derives (a property of its class: ``max_error_ratio``,
  ``ok``, ``mixed``), which the writer adds for other readers and the record recomputes; a field marked
  :data:`NOT_READ` (where a profile came from) is not a key of the file either;
- a key that is absent or null takes the field's default, unless the hint carries :data:`REQUIRED`; null in a
  float field is NaN (JSON has no NaN: :func:`~toolkit.model.records.finite_or_none` wrote it as null); ``{}`` in
  an optional record field is None (an artifact taken as it was has no recipe, written ``{}``);
- strings, integers (not booleans), numbers (integers too) and booleans are never converted into each other; a
  vocabulary field (an enum, or :class:`Words`) takes one of its words; a tuple takes a list; a free-form
  ``JsonObject`` takes any object; :class:`Before` rewrites a value as written (upper case, one number as a list);
- :class:`Rule` is any other check of one value; the rules a record keeps itself (its ``__post_init__``) raise a
  UsageError, which is reported at the record's key (and at ``exc.key`` within it, where the error has one).

Stdlib only: a bundle is read without third-party packages, and ``edgetk --help`` loads nothing of this.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from toolkit.errors import UsageError
from toolkit.model.schemas.problems import Problem, describe, did_you_mean, render_key, toml_type

R = TypeVar("R")
Path = tuple["str | int | TableName", ...]  # the keys and list indices from the document's root

_NONE = type(None)
_HINTS: dict[type, dict[str, object]] = {}  # resolved type expressions (with their Annotated rules)


class TableName(str):
    """A path part that is a table's name the user chose (``pi-1`` in ``[devices.pi-1]``): the header."""


@dataclass(frozen=True)
class Rule:
    """A check of one value beyond its type: ``test(value)`` must hold, else ``message(value)`` with ``fix``."""

    test: Callable[[typing.Any], bool]  # Any: the value as its field's type reads it
    message: Callable[[typing.Any], str]  # Any: as test
    fix: str


@dataclass(frozen=True)
class Words:
    """A string out of a closed vocabulary; ``what`` names it in the message ('unknown runtime ...')."""

    choices: tuple[str, ...]
    what: str


@dataclass(frozen=True)
class Before:
    """A rewrite of the value as written, before its type is checked; a ValueError is the message."""

    rewrite: Callable[[object], object]


class _Marker(enum.Enum):
    REQUIRED = "required"  # the file must write it though the record has a default
    NOT_READ = "not read"  # the record's own fact, never a key of the file


REQUIRED = _Marker.REQUIRED
NOT_READ = _Marker.NOT_READ


class RecordProblem(Exception):
    """What is wrong with the document, as one :class:`Problem` (the first found: unknown keys before missing)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def read_record(cls: type[R], data: object, *, docs: str, at: Path = ()) -> R:
    """``data`` (parsed JSON or TOML) as a ``cls`` record; ``docs`` is the page the fixes point at, ``at`` where
    ``data`` sits in its file (``("recipes", 0)``: keys are named ``recipes[0].format``)."""
    return typing.cast(R, _Reader(docs).record(cls, data, at))


def read_value(tp: object, data: object, *, docs: str) -> object:
    """``data`` read as the type expression ``tp`` (a table of free keys: ``run.toml``)."""
    return _Reader(docs).value(tp, data, ())


def check_record(cls: type, data: object, *, docs: str) -> None:
    """``data`` checked as far as it goes: keys, types, words and rules, but a key left out is no problem (the
    file ``extends`` another, which may have it). Inside a list of tables a key left out still is one: lists are
    replaced wholesale, never merged."""
    _Reader(docs, partial=True, derived=False).record(cls, data, ())


def read_file(cls: type[R], data: object, *, file: object, docs: str, missing_context: str = "") -> R:
    """:func:`read_record` for a whole file a user wrote (keys a record derives are not keys of it): its problem
    as the UsageError that names ``file`` (a missing key's message gets ``missing_context``)."""
    try:
        return typing.cast(R, _Reader(docs, derived=False).record(cls, data, ()))
    except RecordProblem as exc:
        problem = exc.problem
        if problem.kind == "missing" and missing_context:
            problem = dataclasses.replace(problem, message=problem.message[:-1] + missing_context + ".")
        raise problem.error(file) from None


class RuleBroken(UsageError):
    """A record built in code against a rule of its field (:func:`check_rules`); ``key`` names the field."""

    def __init__(self, key: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key = key


def check_rules(record: object) -> None:
    """The :class:`Rule` of each field of ``record`` (a dataclass), for a record built in code rather than read:
    a record's ``__post_init__`` calls it, so its rules are written once, in its hints."""
    hints = _hints(type(record))
    for f in dataclasses.fields(typing.cast(typing.Any, record)):  # Any: fields() wants a DataclassInstance
        value = getattr(record, f.name)
        for rule in _rules(hints[f.name]):
            if isinstance(rule, Rule) and value is not None and not rule.test(value):
                raise RuleBroken(f.name, f"{f.name} {rule.message(value)}.", hint=rule.fix)


def _rules(tp: object) -> tuple[object, ...]:
    """The ``Annotated`` rules of a field's hint, also inside an optional (``Annotated[int, rule] | None``)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(r for a in typing.get_args(tp) for r in _rules(a))
    return _split(tp)[1]


def _hints(cls: type) -> dict[str, object]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def _where(path: Path) -> tuple[str, str]:
    """(table header, key) for a path: the key is named relative to the last table whose name the user chose."""
    names = [i for i, part in enumerate(path) if isinstance(part, TableName)]
    cut = names[-1] + 1 if names else 0
    return render_key(path[:cut]), render_key(path[cut:])


def _leaf(path: Path) -> str:
    names = [p for p in path if isinstance(p, str)]
    return names[-1] if names else ""


def _split(tp: object) -> tuple[object, tuple[object, ...]]:
    """A type expression without its ``Annotated`` rules, and the rules."""
    if typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        return args[0], tuple(args[1:])
    return tp, ()


def _has_default(f: dataclasses.Field[object]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


_INCOMPLETE = object()  # a partial read's record with keys left out: checked, not built


class _Reader:
    def __init__(self, docs: str, *, partial: bool = False, derived: bool = True) -> None:
        self.docs = docs
        self.partial = partial
        self.derived = derived  # a key the record derives (a property) may be written: JSON the toolkit wrote

    def problem(self, kind: str, path: Path, message: str, fix: str) -> RecordProblem:
        table, key = _where(path)
        return RecordProblem(Problem(kind, table, key, message.replace("{key}", repr(key), 1), fix))

    def record(self, cls: type, data: object, path: Path) -> object:
        if not isinstance(data, Mapping):
            raise self._wrong(cls, data, path)
        hints = _hints(cls)
        fields = [f for f in dataclasses.fields(cls) if f.init and NOT_READ not in _rules(hints[f.name])]
        names = [f.name for f in fields]
        for key in data:
            if key not in names and not (self.derived and isinstance(getattr(cls, str(key), None), property)):
                raise self._unknown(str(key), names, path)
        values, missing = {}, []
        for f in fields:
            value = data.get(f.name)
            if value is None and _has_default(f) and REQUIRED not in _rules(hints[f.name]):
                continue
            if f.name not in data:
                missing.append(f.name)
                continue
            values[f.name] = self.value(hints[f.name], value, (*path, f.name))
        if missing or _INCOMPLETE in values.values():
            if self.partial and not any(isinstance(p, int) for p in path):
                return _INCOMPLETE
            raise self.problem("missing", (*path, missing[0]), "the key {key} is missing.",
                               f"Add {missing[0]} = ... ({self.docs} describes it).")
        try:
            return cls(**values)
        except UsageError as exc:  # a rule the record keeps itself, at the key it names
            at = (*path, *str(getattr(exc, "key", "") or "").split(".")) if getattr(exc, "key", None) else path
            raise self.problem("rule", at, "key {key}: " + exc.message, exc.hint or f"See {self.docs}.") from None

    def value(self, tp: object, value: object, path: Path) -> object:
        tp, rules = _split(tp)
        for rule in rules:
            if isinstance(rule, Before):
                try:
                    value = rule.rewrite(value)
                except ValueError as exc:
                    raise self.problem("value_error", path, "key {key}: " + str(exc), f"See {self.docs}.") from None
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(tp) if a is not _NONE]
            if len(inner) != 1:
                raise TypeError(f"a record field of type {tp} has no reading")
            if value is None or (value == {} and dataclasses.is_dataclass(_split(inner[0])[0])):
                return None
            value = self.value(inner[0], value, path)
        else:
            words = [r.what for r in rules if isinstance(r, Words)]
            value = self._typed(tp, value, path, what=words[0] if words else _leaf(path))
        for rule in rules:
            if isinstance(rule, Words):
                value = self._word(rule.choices, rule.what, value, path)
            elif isinstance(rule, Rule) and not rule.test(value):
                raise self.problem("invalid", path, "key {key}: " + rule.message(value) + ".", rule.fix)
        return value

    def _typed(self, tp: object, value: object, path: Path, *, what: str) -> object:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is typing.Any or tp is object:
            return value
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.record(tp, value, path)
        if origin is tuple:
            return self._tuple(tp, args, value, path)
        if origin in (Mapping, dict):
            return self._table(tp, args, value, path)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return tp(self._word(tuple(str(m.value) for m in tp), what, value, path))
        if tp is float and value is None:
            return math.nan
        if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if (tp is int and isinstance(value, int) and not isinstance(value, bool)) or (
                tp in (str, bool) and isinstance(value, typing.cast(type, tp))):
            return value
        raise self._wrong(tp, value, path)

    def _table(self, tp: object, args: tuple[object, ...], value: object, path: Path) -> dict[str, object]:
        if not isinstance(value, Mapping):
            raise self._wrong(tp, value, path)
        inner = _split(args[1])[0]
        named = (isinstance(inner, type) and dataclasses.is_dataclass(inner)) or typing.get_origin(inner) in (
            Mapping, dict)
        out = {}
        for k, v in value.items():
            key = str(self.value(args[0], k, (*path, str(k))))
            out[key] = self.value(args[1], v, (*path, TableName(key) if named else key))
        return out

    def _tuple(self, tp: object, args: tuple[object, ...], value: object, path: Path) -> tuple[object, ...]:
        if not isinstance(value, list):
            raise self._wrong(tp, value, path)
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            raise self._wrong(tp, value, path, expected=f"a list of {len(items)} values")
        out = []
        for i, (item, v) in enumerate(zip(items, value)):
            inner = _split(item)[0]
            if typing.get_origin(inner) in (tuple, Mapping, dict) or dataclasses.is_dataclass(inner):
                out.append(self.value(item, v, (*path, i)))
                continue
            try:  # a list of scalars: name the list, show the item
                out.append(self.value(item, v, path))
            except RecordProblem as exc:
                if exc.problem.kind != "type":
                    raise
                raise self._wrong(tp, v, path) from None
        return tuple(out)

    def _word(self, choices: Sequence[str], what: str, value: object, path: Path) -> str:
        if isinstance(value, str) and value in choices:
            return value
        if not isinstance(value, str):
            raise self._wrong(str, value, path)
        raise self.problem("choice", path, f"key {{key}}: unknown {what} {value!r}{did_you_mean(value, choices)}.",
                           f"Use one of: {', '.join(choices)}.")

    def _unknown(self, name: str, keys: list[str], path: Path) -> RecordProblem:
        top = not path
        message = f"unknown {'top-level ' if top else ''}key {{key}}{did_you_mean(name, keys)}."
        return self.problem("extra_forbidden", (*path, name), message, f"Rename or remove it; the keys "
                            f"{'the file' if top else 'this table'} takes are: {', '.join(keys)} ({self.docs}).")

    def _wrong(self, tp: object, value: object, path: Path, *, expected: str = "") -> RecordProblem:
        expected = expected or describe(tp)
        if not path:
            return self.problem("type", path, f"expected {expected}, got {toml_type(value)}.", f"See {self.docs}.")
        return self.problem("type", path, f"the key {{key}} must be {expected}, got {toml_type(value)} ({value!r}).",
                            f"Write {_leaf(path)} as {expected} ({self.docs}).")
