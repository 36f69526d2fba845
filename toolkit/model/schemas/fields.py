"""Field types for the file schemas: strict TOML scalars, vocabularies and bounds whose errors carry the words
(and the fix) that :mod:`toolkit.model.schemas.problems` puts in front of the user."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

__all__ = ["Table", "Str", "Int", "Number", "Bool", "choice", "at_least", "above", "within", "matching",
           "checked"]

Str = StrictStr
Int = StrictInt
Number = StrictFloat  # strict: an integer is a number, a string or a boolean is not
Bool = StrictBool


class Table(BaseModel):
    """A TOML table: unknown keys are refused (``extra="forbid"``), types are not coerced ("2" is not 2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _invalid(message: str, fix: str, **ctx: Any) -> PydanticCustomError:  # Any: pydantic's ctx values
    # pydantic formats the message with ctx; braces in user values must not be read as placeholders
    return PydanticCustomError("invalid", message.replace("{", "{{").replace("}", "}}"), {"fix": fix, **ctx})


def choice(values: Iterable[str], what: str) -> AfterValidator:
    """A string from a closed vocabulary (``what`` names it in the message: 'unknown runtime ...')."""
    choices = tuple(str(v) for v in values)

    def check(value: str) -> str:
        if value not in choices:
            raise PydanticCustomError("choice", "unknown {what}", {"what": what, "choices": choices})
        return value

    return AfterValidator(check)


def checked(test: Callable[[Any], bool], message: Callable[[Any], str], fix: str) -> AfterValidator:  # Any: as check
    """Any other rule: ``test(value)`` must hold, else ``message(value)`` with ``fix``."""

    def check(value: Any) -> Any:  # Any: the value pydantic parsed for the field, of any type
        if not test(value):
            raise _invalid(message(value), fix)
        return value

    return AfterValidator(check)


def at_least(low: int, fix: str = "Use a positive integer.") -> AfterValidator:
    return checked(lambda v: v >= low, lambda v: f"must be at least {low} (got {v})", fix)


def above(low: float, fix: str) -> AfterValidator:
    return checked(lambda v: v > low, lambda v: f"must be above {low:g} (got {v})", fix)


def within(low: float, high: float, what: str, fix: str) -> AfterValidator:
    return checked(lambda v: low <= v <= high, lambda v: f"must be {what} [{low:g}, {high:g}] (got {v})", fix)


def matching(pattern: str, what: str, fix: str) -> AfterValidator:
    compiled = re.compile(pattern)
    return checked(lambda v: bool(compiled.match(v)), lambda v: f"{v!r} is not {what}", fix)


PositiveInt = Annotated[Int, at_least(1)]
