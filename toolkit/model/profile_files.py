"""Target profile files: find them (shipped, ``EDGETK_TARGETS_PATH``, ``--targets-dir``), read and check each
one on its own, and merge a profile over the one it ``extends``.

What comes out is a profile's merged TOML data and the files it came from; :mod:`toolkit.model.targets` checks
the merged profile across keys and builds the :class:`~toolkit.model.targets.TargetProfile`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UsageError
from toolkit.model.records import JsonDict, JsonObject
from toolkit.model.schemas.problems import did_you_mean

ENV_VAR = "EDGETK_TARGETS_PATH"


def refusal(path: Path, key: str, problem: str, fix: str) -> UsageError:
    """The one form of a profile's refusal: the file, the key, the problem and the fix."""
    return UsageError(f"{path}: key '{key}': {problem}", hint=fix)


FileCheck = Callable[[Path, JsonObject], None]  # what can be checked in one file on its own


def duplicate_runtimes(path: Path, data: JsonObject) -> None:
    """A runtime listed twice in one file is refused (the engine reads a list, not a set)."""
    names = [str(r.get("name")) for r in data.get("runtimes", ()) if isinstance(r, Mapping)]
    for name in sorted(set(names)):
        if names.count(name) > 1:
            raise refusal(path, "runtimes", f"runtime {name!r} is listed twice.", "List each runtime once.")


@dataclass(frozen=True)
class ProfileSource:
    """One profile file as read: its name, its TOML data, where it is and whether it is shipped or the user's."""

    name: str
    data: JsonDict  # the parsed TOML (tomllib's values)
    path: Path
    origin: str  # "shipped" or "user"


def _read(path: Path, origin: str, check: FileCheck) -> ProfileSource:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}.", hint="Fix the syntax (https://toml.io).") from exc
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the profile: {exc.strerror}.") from exc
    check(path, data)
    name = data.get("name", path.stem)
    if name != path.stem:
        raise refusal(path, "name", f"{name!r} does not match the file name {path.name!r}.",
                      f"Rename the file to {name}.toml or set name = {path.stem!r}.")
    return ProfileSource(name=name, data=data, path=path, origin=origin)


def _user_dirs(targets_dirs: Sequence[Path]) -> list[tuple[Path, str]]:
    dirs: list[tuple[Path, str]] = []
    for entry in os.environ.get(ENV_VAR, "").split(os.pathsep):
        if entry.strip():
            dirs.append((Path(entry).expanduser(), f"the {ENV_VAR} entry"))
    dirs.extend((Path(d).expanduser(), "--targets-dir") for d in targets_dirs)
    return dirs


def read_layers(targets_dirs: Sequence[Path], *, check: FileCheck) -> dict[str, list[ProfileSource]]:
    """name -> every file defining it, lowest precedence first; ``check`` refuses a file that is wrong on its
    own (keys, types, values), before ``extends`` is merged."""
    from toolkit.resources import targets_dir

    sources: list[tuple[Path, str]] = [(targets_dir(), "shipped")]
    for directory, what in _user_dirs(targets_dirs):
        if not directory.is_dir():
            raise UsageError(f"{what} {directory} is not a directory.",
                             hint="Point it at a folder of <name>.toml target profiles.")
        sources.append((directory, "user"))
    layers: dict[str, list[ProfileSource]] = {}
    seen: set[Path] = set()
    for directory, origin in sources:
        resolved = directory.resolve()
        if resolved in seen:
            continue
        seen.add(resolved)
        for path in sorted(resolved.glob("*.toml")):
            raw = _read(path, origin, check)
            layers.setdefault(raw.name, []).append(raw)
    return layers


def _merge(base: JsonObject, over: JsonObject) -> JsonDict:
    merged = dict(base)
    for key, value in over.items():
        if key == "sources":
            merged[key] = list(dict.fromkeys([*base.get("sources", []), *value]))
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = _merge(base[key], value)
        else:
            merged[key] = value
    return merged


def resolve(name: str, index: int, layers: Mapping[str, list[ProfileSource]],
            chain: tuple[tuple[str, int], ...] = ()) -> tuple[JsonDict, tuple[ProfileSource, ...]]:
    """The ``index``-th file of profile ``name`` merged over what it extends, and the files merged (it first)."""
    raw = layers[name][index]
    parent = raw.data.get("extends")
    if parent is None:
        return dict(raw.data), (raw,)
    if parent == name:  # extends the profile this one shadows
        if index == 0:
            raise refusal(raw.path, "extends", f"{name!r} extends itself and shadows no other profile.",
                          "Remove extends, or name a profile that exists.")
        target = (name, index - 1)
    elif parent in layers:
        target = (parent, len(layers[parent]) - 1)
    else:
        raise refusal(raw.path, "extends", f"no profile named {parent!r}{did_you_mean(parent, list(layers))}.",
                      "Run `edgetk targets list` to see the profiles.")
    if target in chain or target == (name, index):
        cycle = " -> ".join([n for n, _ in chain] + [name, target[0]])
        raise refusal(raw.path, "extends", f"extends forms a cycle ({cycle}).", "Break the cycle: one profile "
                      "in it must not extend another.")
    base, lineage = resolve(target[0], target[1], layers, chain + ((name, index),))
    data = _merge(base, {k: v for k, v in raw.data.items() if k != "extends"})
    data["name"] = name
    return data, (raw, *lineage)
