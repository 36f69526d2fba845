"""Click options generated from the option groups of ``toolkit.model.options`` (one definition for the CLI, the API
and run.toml), plus the parameter types every command uses.

The types here keep ``edgetk --help`` light: :class:`PathType` turns a value into a ``pathlib.Path`` only when
one is given, and :class:`LazyChoice` reads its vocabulary (``toolkit.model.vocabulary``) only when a value is checked or
a command's own help is shown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar  # Any: click's untyped values and keyword arguments

import click

from toolkit.model.flags import Kind, Option, options_of
from toolkit.model.options import CheckOptions, ConvertOptions, DeviceOptions, RolloutOptions

F = TypeVar("F", bound=Callable[..., Any])


class PathType(click.Path):
    """``click.Path(path_type=Path)`` without importing pathlib before a value is converted."""

    def __init__(self) -> None:
        super().__init__()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pathlib import Path

        return Path(str(super().convert(value, param, ctx)))


class LazyChoice(click.Choice[str]):
    """A ``click.Choice`` whose choices come from a function, called on first use."""

    def __init__(self, load: Callable[[], Sequence[str]], case_sensitive: bool = True) -> None:
        self._load = load
        self._choices: tuple[str, ...] | None = None
        self.case_sensitive = case_sensitive

    @property
    def choices(self) -> tuple[str, ...]:  # click's is a plain attribute; here it loads on first use
        if self._choices is None:
            self._choices = tuple(self._load())
        return self._choices

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        self._choices = tuple(value)


def _click_type(option: Option) -> Any:
    how = option.flag
    if how.kind is Kind.PATH:
        return PathType()
    if how.kind is Kind.CHOICE:
        assert how.choices is not None, option.field
        return LazyChoice(how.choices)
    if how.kind in (Kind.INT, Kind.FLOAT):
        number = click.IntRange if how.kind is Kind.INT else click.FloatRange
        if how.minimum is None and how.maximum is None:
            return int if how.kind is Kind.INT else float
        return number(how.minimum, how.maximum)  # type: ignore[arg-type]
    return None  # text


def click_option(option: Option) -> Callable[[F], F]:
    """The click option of one flagged field."""
    how = option.flag
    kwargs: dict[str, Any] = {"help": how.help}
    if how.kind is Kind.SWITCH:
        kwargs["is_flag"] = True
        kwargs["default"] = False if how.inverted else bool(option.default)
    else:
        kwargs["type"] = _click_type(option)
        kwargs["multiple"] = how.multiple
        if how.metavar:
            kwargs["metavar"] = how.metavar
        if not how.multiple and how.kind is not Kind.SHAPES:
            kwargs["default"] = option.default
            kwargs["show_default"] = how.show_default
    return click.option(option.long, option.param, **kwargs)


def click_options(*classes: type) -> Callable[[F], F]:
    """A decorator adding every flagged field of the option classes as click options, in declaration order."""
    options = [o for cls in classes for o in options_of(cls)]

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = click_option(option)(func)
        return func

    return decorate


convert_options = click_options(ConvertOptions)
device_options = click_options(DeviceOptions)
check_options = click_options(CheckOptions)
rollout_options = click_options(RolloutOptions)

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
