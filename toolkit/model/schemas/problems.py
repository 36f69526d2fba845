"""The words of every refusal of a file: the ONE did-you-mean, :class:`Problem` (where, what, the fix) and how a
type or a value is named in TOML terms. The engine (:mod:`toolkit.model.reading`) finds the problem; this
module says it:

    targets/my-board.toml: unknown key 'recipes[0].io_dtyp' (did you mean 'io_dtype'?).
    Rename or remove it; the keys this table takes are: format, precision, ... (docs/targets.md).

Keys inside a table the user named (``[devices.pi-1]``) are reported relative to that table's header, so an
inventory error reads ``inv.toml: [devices.pi-1]: unknown key 'hots' (did you mean 'host'?).``
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

    kind: str  # "extra_forbidden", "missing", "type", "choice", "invalid", "value_error", "rule"
    table: str  # "devices.pi-1" when the key sits in a table the user named, else ""
    key: str  # "recipes[0].io_dtyp", "cpu.cores"; "" for the file as a whole
    message: str
    fix: str

    def text(self, file: object) -> str:
        where = f"[{self.table}]: " if self.table else ""
        return f"{file}: {where}{self.message}"

    def error(self, file: object) -> UsageError:
        return UsageError(self.text(file), hint=self.fix or None)


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


_PLURAL = {"an integer": "integers", "a number": "numbers", "a string": "strings", "true or false": "booleans",
           "a table": "tables"}


def _unwrap(tp: object) -> object:
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


def describe(tp: object) -> str:
    """What a value of type ``tp`` (a type expression) is, in TOML words: 'an integer', 'a list of strings'."""
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
    if origin in (dict, Mapping) or dataclasses.is_dataclass(tp):
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
