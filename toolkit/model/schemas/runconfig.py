"""The schema of ``run.toml`` (toolkit.model.runconfig): flat ``flag-name = value`` lines. Which names are options is
the ``edgetk run`` command's to say (its flags), so the CLI checks those, with the same did-you-mean."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import RootModel

from toolkit.model.schemas.fields import Str, checked

Value = Annotated[Any, checked(lambda v: not isinstance(v, dict), lambda v: "a table is not a run option",
                               'Write flat `flag-name = value` lines, e.g. target = "raspberry-pi-4".')]


class RunFile(RootModel[dict[Str, Value]]):
    """A value is Any: a flag's value may be any TOML scalar or array."""
