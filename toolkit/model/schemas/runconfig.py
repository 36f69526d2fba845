"""The schema of ``run.toml`` (toolkit.model.runconfig): flat ``flag-name = value`` lines. Which names are options is
the ``edgetk run`` command's to say (its flags), so the CLI checks those, with the same did-you-mean. Read by
:mod:`toolkit.model.reading` (the one engine for records read from files)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from toolkit.model.reading import Rule

DOCS = "docs/cli.md"

# A flag's value may be any TOML scalar or array (object), never a table.
Value = Annotated[object, Rule(lambda v: not isinstance(v, dict), lambda v: "a table is not a run option",
                               'Write flat `flag-name = value` lines, e.g. target = "raspberry-pi-4".')]
RunFile = Mapping[str, Value]
