"""How a field of an options group (:mod:`toolkit.model.options`) is a command-line flag: its :class:`Flag`
(help, kind, name, choices, bounds) in the field's metadata, the flagged fields of a class (:func:`options_of`),
and a given value normalised to the field's type (:func:`normalise`, :func:`parse_input_shapes`).

Imported by ``edgetk --help``: the standard library only (paths and the choice lists load when a value is
converted).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.errors import UsageError

FLAG = "edgetk.flag"  # the key of a field's metadata that holds its Flag


class Kind(enum.Enum):
    """What a flag's value is: decides its click type and how a value is normalised."""

    TEXT = "text"
    PATH = "path"
    INT = "int"
    FLOAT = "float"
    CHOICE = "choice"
    SWITCH = "switch"  # a boolean flag without a value
    SHAPES = "shapes"  # NAME=D0,D1,... (repeatable) -> {name: (d0, d1, ...)}


@dataclass(frozen=True)
class Flag:
    """How a field appears on the command line.

    ``name`` defaults to ``--<field-name>`` with dashes; ``inverted`` makes a switch that turns the field off
    (``--no-cache`` sets ``use_cache=False``); ``choices`` is a function so the vocabulary (``toolkit.model.vocabulary``)
    loads only when a value is checked; ``words`` names a StrEnum there: its values are the choices and its members
    the field's values (the word is parsed here, at the boundary); ``minimum``/``maximum`` bound numbers.
    """

    help: str
    kind: Kind = Kind.TEXT
    name: str | None = None
    multiple: bool = False
    choices: Callable[[], tuple[str, ...]] | None = None
    metavar: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    inverted: bool = False
    show_default: bool = False
    words: str | None = None

    def __post_init__(self) -> None:
        if self.words is not None and self.choices is None:
            object.__setattr__(self, "choices", vocabulary(self.words))


def flag(help: str, **how: Any) -> dict[str, Flag]:  # Any: Flag's keyword fields, checked by Flag
    """``field(metadata=flag(...))``: the field is an option of the CLI (see :class:`Flag`)."""
    return {FLAG: Flag(help, **how)}


@dataclass(frozen=True)
class Option:
    """One field of an options class that has a flag: its field name, flag and the click parameter name."""

    field: str
    flag: Flag
    default: Any  # Any: the field's default, of the field's own type
    annotation: Any = None  # Any: the field's type, as written (a type expression)

    @property
    def long(self) -> str:
        return self.flag.name or "--" + self.field.replace("_", "-")

    @property
    def param(self) -> str:
        """The click parameter name: the field's, or for an inverted switch the flag's (``no_cache``)."""
        return self.long[2:].replace("-", "_") if self.flag.inverted else self.field


def options_of(cls: type) -> tuple[Option, ...]:
    """The fields of ``cls`` that have a flag, in declaration order."""
    out = []
    for f in dataclasses.fields(cls):
        how = f.metadata.get(FLAG)
        if how is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append(Option(f.name, how, default, f.type))
    return tuple(out)


def vocabulary(name: str) -> Callable[[], tuple[str, ...]]:
    """The values of ``toolkit.model.vocabulary.<name>`` (a tuple, a Literal alias or an Enum), loaded on first use."""

    def load() -> tuple[str, ...]:
        import typing

        from toolkit.model import vocabulary as words

        value = getattr(words, name)
        if isinstance(value, type) and issubclass(value, enum.Enum):
            return tuple(str(m.value) for m in value)
        if isinstance(value, tuple):
            return tuple(str(v) for v in value)
        return tuple(str(v) for v in typing.get_args(value))

    return load


def normalise(option: Option, value: Any) -> Any:  # Any: a click value in, the field's type out
    """A value as given (str or Path, list or tuple, mapping or NAME=D0,... strings) -> the field's type."""
    from pathlib import Path

    how = option.flag
    if value is None:
        return () if how.multiple and how.kind is not Kind.SHAPES else ({} if how.kind is Kind.SHAPES else None)
    if how.kind is Kind.SHAPES:
        if isinstance(value, Mapping):
            return {str(k): tuple(int(d) for d in v) for k, v in value.items()}
        return parse_input_shapes([value] if isinstance(value, str) else list(value))
    if how.kind is Kind.SWITCH:
        return bool(value)
    if how.multiple:
        items = [value] if isinstance(value, (str, Path)) or not isinstance(value, Iterable) else list(value)
        return tuple(Path(v) if how.kind is Kind.PATH else _member(option, v) for v in items)
    if how.kind is Kind.PATH:
        return Path(value)
    return _member(option, value)


def words_to_members(options: object) -> None:
    """The words of a frozen options object's ``words`` flags as their members, however it was built (the CLI,
    the API's keywords, a direct call): the one place they are parsed."""
    for option in options_of(type(options)):
        if option.flag.words is not None:
            object.__setattr__(options, option.field, normalise(option, getattr(options, option.field)))


def _member(option: Option, value: Any) -> Any:  # Any: as normalise
    """A word of a ``words`` flag as its vocabulary's member (else the value as given); a word outside the
    vocabulary (from the API: the CLI's choices refuse it first) is a UsageError naming the flag."""
    if option.flag.words is None:
        return value
    from toolkit.model import vocabulary as words

    kind = getattr(words, option.flag.words)
    try:
        return kind(value)
    except ValueError:
        raise UsageError(f"{option.long}: unknown value {value!r}.",
                         hint=f"Use one of: {', '.join(kind.values())}.") from None


def parse_input_shapes(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``--input-shape NAME=D0,D1,...`` -> {NAME: (D0, D1, ...)}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, dims = value.partition("=")
        try:
            parsed = tuple(int(d) for d in dims.split(",")) if sep and dims else ()
        except ValueError:
            parsed = ()
        if not name or not parsed or any(d <= 0 for d in parsed):
            raise UsageError(
                f"--input-shape {value!r} is not NAME=D0,D1,... with positive integers.",
                hint="For example --input-shape image=1,224,224,3",
            )
        shapes[name] = parsed
    return shapes
