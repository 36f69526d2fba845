"""``run.toml``: the effective options of an ``edgetk run``, kept in the bundle so the run can be replayed.

The keys are the command's flag names without the dashes (``target``, ``device``, ``precision``,
``budget-ms``...), the values what the run used (paths made absolute, so the replay works from any folder).
``edgetk run --config bundles/NAME/run.toml`` does the same run again; flags given beside ``--config`` win.
Written with a small TOML emitter (strings, numbers, booleans and lists of them are all a run needs); read
with the standard library's ``tomllib``.
"""

from __future__ import annotations

import json
import math
import tomllib
import typing
from pathlib import Path

from toolkit.errors import UsageError
from toolkit.model.records import JsonDict, JsonObject

RUN_CONFIG = "run.toml"
_HEADER = (
    "# The options of the `edgetk run` that made this bundle. Replay it with:\n"
    "#   edgetk run --config {path}\n"
    "# Flags given beside --config override the values here.\n"
)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write {value} to TOML")
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise ValueError(f"cannot write a {type(value).__name__} to run.toml")


def dump_toml(config: JsonObject) -> str:
    """Flat ``key = value`` lines; None values are left out (TOML has no null: absent means the default)."""
    lines = []
    for key, value in config.items():
        if value is None:
            continue
        lines.append(f"{json.dumps(key) if not key.replace('-', '').replace('_', '').isalnum() else key} = "
                     f"{_value(value)}")
    return "\n".join(lines) + "\n"


def write_run_config(bundle_dir: Path, config: JsonObject) -> Path:
    """Write ``run.toml`` into the bundle (not a deployed file: the manifest does not list it)."""
    path = Path(bundle_dir) / RUN_CONFIG
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(_HEADER.format(path=path) + dump_toml(config))
    tmp.replace(path)
    return path


def read_run_config(path: Path) -> JsonDict:
    """A run config file -> {key with dashes: value}; a bundle directory means its run.toml."""
    path = Path(path)
    if path.is_dir():
        path = path / RUN_CONFIG
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"The run config {path} does not exist.",
                         hint="Pass a TOML file, or a bundle made by `edgetk run` (it holds run.toml).") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Cannot read the run config {path}: {exc}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"The run config {path} is not valid TOML: {exc}.") from None
    from toolkit.model.reading import RecordProblem, read_value
    from toolkit.model.schemas.runconfig import DOCS, RunFile

    try:
        run = typing.cast(JsonDict, read_value(RunFile, data, docs=DOCS))
    except RecordProblem as exc:
        raise exc.problem.error(path) from None
    return {key.replace("_", "-"): value for key, value in run.items()}
