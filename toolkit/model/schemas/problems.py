"""The ONE did-you-mean formatter: a pydantic ``ValidationError`` (or a bare word against a vocabulary) -> one
plain :class:`~toolkit.errors.UsageError` that names the file, the key and the fix.

pydantic says *where* (``loc``: ``("recipes", 0, "io_dtyp")``) and *what* (``type``: ``extra_forbidden``,
``missing``, ``int_type``, or one of ours from :mod:`toolkit.model.schemas.fields`); the schema model says what the
key could have been (its fields, its vocabulary). This module turns the three into a sentence:

    targets/my-board.toml: unknown key 'recipes[0].io_dtyp' (did you mean 'io_dtype'?).
    Rename or remove it; the keys this table takes are: format, precision, ... (docs/targets.md).

Keys inside a table the user named (``[devices.pi-1]``) are reported relative to that table's header, so an
inventory error reads ``inv.toml: [devices.pi-1]: unknown key 'hots' (did you mean 'host'?).``
The schema's types are walked as ``Any``: a type expression (Annotated, a union) has no type of its own.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.errors import UsageError

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice ``word`` was most likely meant to be (case-insensitive), or None when none is close."""
    by_lower = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


def did_you_mean(word: str, choices: Iterable[str], *, sentence: bool = False) -> str:
    """`` (did you mean 'x'?)`` to append to a message, or ``Did you mean 'x'? `` to start a hint
    (``sentence=True``); empty when nothing is close."""
    match = closest(word, choices)
    if match is None:
        return ""
    return f"Did you mean {match!r}? " if sentence else f" (did you mean {match!r}?)"


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a file: where (``table`` header of a user-named table, ``key`` within it), what
    (``message``, which names the key) and the ``fix``."""

    kind: str  # pydantic's error type, or ours ("choice", "invalid")
    table: str  # "devices.pi-1" when the key sits in a table the user named, else ""
    key: str  # "recipes[0].io_dtyp", "cpu.cores"; "" for the file as a whole
    message: str
    fix: str

    def text(self, file: object) -> str:
        where = f"[{self.table}]: " if self.table else ""
        return f"{file}: {where}{self.message}"

    def error(self, file: object) -> UsageError:
        return UsageError(self.text(file), hint=self.fix or None)


def _unwrap(tp: Any) -> Any:
    """Strip Annotated[...] and Optional (``X | None``) down to X."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "model_fields")


def _step(tp: Any, part: str | int) -> Any:
    """The type one step down ``tp`` along a pydantic location part (None when unknown)."""
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if isinstance(part, int):
        args = typing.get_args(tp)
        return args[0] if origin in (list, tuple, Sequence) and args else None
    if _is_model(tp):
        if part not in tp.model_fields and "root" in tp.model_fields:  # a RootModel: its locations skip "root"
            return _step(tp.model_fields["root"].annotation, part)
        field = tp.model_fields.get(part)
        return field.annotation if field is not None else None
    if origin is dict:
        return typing.get_args(tp)[1]
    return None


def _is_named_tables(tp: Any) -> bool:
    """A ``dict[str, Table]``: tables whose names the user chooses (``[devices.NAME]``)."""
    tp = _unwrap(tp)
    if _is_model(tp) and "root" in tp.model_fields:
        tp = _unwrap(tp.model_fields["root"].annotation)
    if typing.get_origin(tp) is not dict:
        return False
    value = _unwrap(typing.get_args(tp)[1])
    return _is_model(value) or typing.get_origin(value) is dict


def _render(part: str) -> str:
    return part if _BARE_KEY.match(part) else json.dumps(part)


def render_key(path: Sequence[str | int]) -> str:
    """A path as the user would write it: ``recipes[0].io_dtype``, ``devices."my pi"``, ``devices.pi-1``."""
    key = ""
    for part in path:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key = f"{key}.{_render(part)}" if key else _render(part)
    return key


def _locate(model: Any, loc: Sequence[str | int]) -> tuple[str, str, list[Any]]:
    """(table header, key, the type at each step) for a pydantic location. A location that ends in
    ``[key]`` is about a table's name itself: the name stays in the key."""
    table, key = "", ""
    tp: Any = model
    trail: list[Any] = [model]
    about_name = bool(loc) and loc[-1] == "[key]"
    if about_name:
        loc = loc[:-1]
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif tp is not None and _is_named_tables(tp) and not about_name:  # a user's table name: the header
            table = ".".join(p for p in (table, key, _render(part)) if p)
            key = ""
        else:
            key = f"{key}.{_render(part)}" if key else _render(part)
        tp = _step(tp, part) if tp is not None else None
        trail.append(tp)
    return table, key, trail


_PLURAL = {"an integer": "integers", "a number": "numbers", "a string": "strings", "true or false": "booleans",
           "a table": "tables"}


def describe(tp: Any) -> str:
    """What a value of type ``tp`` is, in TOML words: 'an integer', 'a list of strings', 'a table'."""
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str or (isinstance(tp, type) and issubclass(tp, str)):
        return "a string"
    if origin in (list, tuple, Sequence):
        args = typing.get_args(tp)
        inner = describe(args[0]) if args else "value"
        return f"a list of {_PLURAL.get(inner, 'values')}"
    if origin in (dict, Mapping) or _is_model(tp) or dataclasses.is_dataclass(tp):
        return "a table"
    return "a value of another kind"


def toml_type(value: object) -> str:
    """The TOML word for a parsed value's type."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _leaf(loc: Sequence[str | int]) -> str:
    names = [p for p in loc if isinstance(p, str) and p != "[key]"]
    return names[-1] if names else ""


def problems(error: Any, model: type, *, docs: str, missing_context: str = "") -> list[Problem]:
    """Every error in a ``pydantic.ValidationError`` (Any: not imported here) against ``model``, as :class:`Problem`; unknown keys
    first (a typo also makes a required key "missing": the typo is the news), missing keys last."""
    out: list[Problem] = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        kind = item["type"]
        ctx = item.get("ctx") or {}
        value = item.get("input")
        if kind != "extra_forbidden" and loc and isinstance(loc[-1], int):
            loc = loc[:-1]  # an item of a list of scalars: name the list ('fallback', not 'fallback[1]')
        table, key, trail = _locate(model, loc)
        leaf = _leaf(loc)
        if kind == "extra_forbidden":
            owner: Any = _unwrap(trail[-2]) if len(trail) >= 2 else None
            keys = list(owner.model_fields) if _is_model(owner) else []
            what = "the file" if len(loc) == 1 else "this table"
            top = "top-level " if len(loc) == 1 else ""
            message = f"unknown {top}key {key!r}{did_you_mean(leaf, keys)}."
            fix = f"Rename or remove it; the keys {what} takes are: {', '.join(keys)} ({docs})."
        elif kind == "missing":
            message = f"the key {key!r} is missing{missing_context}."
            fix = f"Add {leaf} = ... ({docs} describes it)."
        elif kind == "choice":
            choices = [str(c) for c in ctx.get("choices", ())]
            message = f"key {key!r}: unknown {ctx.get('what', leaf)} {value!r}{did_you_mean(str(value), choices)}."
            fix = f"Use one of: {', '.join(choices)}."
        elif kind == "invalid":
            message = f"key {key!r}: {item['msg']}."
            fix = str(ctx.get("fix", f"See {docs}."))
        elif kind == "value_error":  # a validator's own ValueError: its text is the message
            message = f"key {key!r}: {ctx.get('error', item['msg'])}"
            fix = f"See {docs}."
        elif kind.endswith("_type") or kind.endswith("_parsing") or kind in ("int_from_float", "model_attributes_type"):
            expected = describe(trail[-1]) if trail[-1] is not None else "something else"
            if not key:
                message = f"expected {expected}, got {toml_type(value)}."
                fix = f"See {docs}."
            else:
                message = f"the key {key!r} must be {expected}, got {toml_type(value)} ({value!r})."
                fix = f"Write {leaf} as {expected} ({docs})."
        else:  # a pydantic constraint we did not word ourselves
            message = f"key {key!r}: {str(item['msg'])[:1].lower()}{str(item['msg'])[1:]} (got {value!r})."
            fix = f"See {docs}."
        out.append(Problem(kind=kind, table=table, key=key, message=message, fix=fix))
    order = {"extra_forbidden": 0, "missing": 2}
    return sorted(out, key=lambda p: order.get(p.kind, 1))
