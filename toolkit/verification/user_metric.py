"""``--metric file.py:fn``: a metric the user writes for a task the toolkit does not know.

``fn(reference_outputs, artifact_outputs, labels)`` gets, per output, the float model's and the artifact's
outputs over the eval set as arrays ``[samples, ...]`` (lists in output order) and the labels (``y`` of the
eval data) or None, and returns a mapping of metric names to numbers plus ``"ok"``: a bool that gates the
artifact like the built-in tolerances do.

The metric is the judge of the outputs it covers: every output, or those named by the function's ``outputs``
attribute (``fn.outputs = ("boxes", "scores")``). For those outputs the tensor statistics (cosine, relative
error, slices, role and task metrics) stay in the manifest as information and gate nothing.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.errors import UsageError
from toolkit.model.records import JsonDict

HINT = ("Pass --metric path/to/file.py:function, where function(reference, artifact, labels) returns "
        "{name: value, 'ok': bool}.")


@dataclass(frozen=True)
class UserMetric:
    spec: str  # as given: "file.py:fn"
    fn: Callable[..., Any]  # Any: the user's function, its result checked by evaluate
    outputs: tuple[str, ...] | None = None  # the outputs it judges (``fn.outputs``); None: all of them

    def covers(self, names: Sequence[str]) -> tuple[str, ...]:
        """The names among ``names`` this metric judges (all of them when it names none)."""
        return tuple(names) if self.outputs is None else tuple(n for n in names if n in self.outputs)


@dataclass(frozen=True)
class UserMetricResult:
    spec: str
    values: Mapping[str, float]
    ok: bool
    covers: tuple[str, ...] = ()  # the outputs it judged: the tensor gates do not apply to them

    def to_dict(self) -> JsonDict:
        return {"metric": self.spec, "values": dict(self.values), "ok": self.ok, "covers": list(self.covers)}


def load(spec: str) -> UserMetric:
    """The function ``spec`` names, or a usage error saying what is wrong with it."""
    path_text, sep, name = str(spec).rpartition(":")
    if not sep or not path_text or not name.isidentifier():
        raise UsageError(f"--metric {spec!r} is not FILE.py:FUNCTION.", hint=HINT)
    path = Path(path_text)
    if path.suffix != ".py" or not path.is_file():
        raise UsageError(f"--metric {spec!r}: {path} is not a Python file.", hint=HINT)
    module_spec = importlib.util.spec_from_file_location(f"edgetk_user_metric_{abs(hash(str(path.resolve())))}", path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"--metric {spec!r}: cannot load {path}.", hint=HINT)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: any error is theirs to see
        raise UsageError(f"--metric {spec!r}: importing {path} failed: {type(exc).__name__}: {exc}.",
                         hint="Fix the file; run it with python to see the traceback.") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UsageError(f"--metric {spec!r}: {path} has no function {name!r}.", hint=HINT)
    named = getattr(fn, "outputs", None)
    if named is not None and (isinstance(named, str) or not all(isinstance(n, str) for n in named)):
        raise UsageError(f"--metric {spec!r}: {name}.outputs is {named!r}, not a list of output names.",
                         hint="Set it to the names of the outputs the metric judges, or leave it out for all.")
    return UserMetric(str(spec), fn, None if named is None else tuple(named))


def evaluate(metric: UserMetric, reference: Sequence[object], artifact: Sequence[object], labels: object,
             names: Sequence[str] = ()) -> UserMetricResult:
    """Run the user's function and check what it returns; ``names``: the model's outputs, for ``covers``."""
    if metric.outputs is not None:
        unknown = [n for n in metric.outputs if n not in names]
        if unknown:
            raise UsageError(f"--metric {metric.spec}: outputs {unknown} are not outputs of the model "
                             f"({', '.join(names)}).", hint="Name the model's outputs in the function's "
                             "outputs attribute, or leave it out to judge all of them.")
    try:
        raw = metric.fn(list(reference), list(artifact), labels)
    except Exception as exc:
        raise UsageError(f"--metric {metric.spec}: the function raised {type(exc).__name__}: {exc}.",
                         hint="Fix the metric; it gets lists of [samples, ...] arrays per output and the "
                         "labels.") from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("ok"), bool):
        raise UsageError(f"--metric {metric.spec}: the function returned {type(raw).__name__}, not a mapping with "
                         "a bool under 'ok'.", hint=HINT)
    values: dict[str, float] = {}
    for key, value in raw.items():
        if key == "ok":
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"--metric {metric.spec}: the value of {key!r} is {value!r}, not a number.",
                             hint=HINT) from None
        values[str(key)] = number if math.isfinite(number) else float("nan")
    return UserMetricResult(metric.spec, values, bool(raw["ok"]), metric.covers(names))
