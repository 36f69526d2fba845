"""The options that several commands share, each written once: a frozen dataclass per group whose fields say
what the option is, its default and its command-line flag.

The CLI's click options are generated from these fields (``toolkit.cli.options.click_options``), the API's
keyword arguments are checked against them (:func:`split_keywords`), and ``run.toml`` records them under their
flag names: adding an option is one field here (with its :func:`flag`) plus the code that uses the value. This
module is imported by ``edgetk --help``: ``dataclasses`` and ``enum`` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from toolkit.errors import UsageError
from toolkit.model.flags import Kind, flag, normalise, options_of, vocabulary, words_to_members
from toolkit.model.records import JsonDict, JsonObject

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from toolkit.model.vocabulary import CalibrationMethod, Format, IoDtype, Precision

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])

def build(cls: type[T], values: JsonObject, **fixed: Any) -> T:  # Any: field values, checked by cls
    """An options object from keyword values by field name (unknown names refused with ``TypeError``)."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise TypeError(f"unexpected option(s) for {cls.__name__}: {', '.join(unknown)}")
    by_field = {o.field: o for o in options_of(cls)}
    kwargs = {k: (normalise(by_field[k], v) if k in by_field else v) for k, v in values.items()}
    kwargs.update(fixed)
    return cls(**kwargs)


def keywords_from_params(params: JsonObject, *classes: type) -> JsonDict:
    """Parsed click parameters (keys are click parameter names; others ignored) -> the option classes' keyword
    arguments by field name (an inverted switch turned back: ``no_cache=True`` -> ``use_cache=False``)."""
    values: JsonDict = {}
    for cls in classes:
        for option in options_of(cls):
            if option.param in params:
                value = params[option.param]
                values[option.field] = (not value) if option.flag.inverted else value
    return values


def split_keywords(caller: str, values: JsonObject, *classes: type) -> tuple[JsonDict, ...]:
    """Keyword arguments -> one dict per option class (each keyword must be a flagged field of one of them,
    else ``TypeError`` naming ``caller``, as Python does for a function's unknown keyword)."""
    fields = [{o.field for o in options_of(cls)} for cls in classes]
    unknown = sorted(set(values) - set().union(*fields))
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword argument(s): {', '.join(unknown)}")
    return tuple({k: v for k, v in values.items() if k in names} for names in fields)


def with_option_keywords(*classes: type) -> Callable[[F], F]:
    """List the option classes' fields as keyword-only parameters in the function's run-time signature
    (``help()``, ``inspect.signature``), in place of its ``**options``; the type checker sees the function as
    written (its ``**options: Unpack[...]``, :mod:`toolkit.api.keywords`)."""

    def decorate(func: F) -> F:
        import inspect

        signature = inspect.signature(func)
        params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in params}
        for cls in classes:
            for option in options_of(cls):
                if option.field not in names:
                    params.append(inspect.Parameter(option.field, inspect.Parameter.KEYWORD_ONLY,
                                                    default=option.default, annotation=option.annotation))
                    names.add(option.field)
        params.sort(key=lambda p: p.kind)  # keep Python's parameter order valid
        func.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return func

    return decorate


def _task_names() -> tuple[str, ...]:
    from toolkit.model.tasks import Task

    return tuple(t.value for t in Task)


@dataclass(frozen=True, kw_only=True)
class ConvertOptions:
    """Everything ``edgetk convert`` takes; also stored in the manifest so a run can be replayed."""

    source: str
    target: str | None = field(default=None, metadata=flag(
        "Target profile (default: this machine's).", metavar="NAME"))
    calibration: Path | None = field(default=None, metadata=flag(
        "Calibration data: .npy, .npz (keys = input names, or x) or an image folder.", kind=Kind.PATH))
    eval_data: Path | None = field(default=None, metadata=flag(
        "Held-out data for verification (.npz; labels under y give accuracy).", kind=Kind.PATH))
    precisions: tuple[Precision, ...] = field(default=(), metadata=flag(
        "Build these precisions instead of the profile's recipes (repeatable).", kind=Kind.CHOICE,
        name="--precision", multiple=True, words="Precision"))
    formats: tuple[Format, ...] = field(default=(), metadata=flag(
        "Artifact formats to build (repeatable).", kind=Kind.CHOICE, name="--format", multiple=True,
        words="Format"))
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict, metadata=flag(
        "Pin an input's shape (batch defaults to 1).", kind=Kind.SHAPES, name="--input-shape", multiple=True,
        metavar="NAME=D0,D1,..."))
    input_values: tuple[str, ...] = field(default=(), metadata=flag(
        "Fix an input to one value (a sample rate): every calibration and held-out sample is fed it, and an ONNX "
        "If it picks is folded to its branch before quantizing (repeatable).", name="--input-value",
        multiple=True, metavar="NAME=VALUE"))
    name: str | None = field(default=None, metadata=flag("Bundle name (default: <source stem>-<target>)."))
    out: Path | None = field(default=None, metadata=flag(
        "Bundle directory (default ./bundles/<name>).", kind=Kind.PATH))
    force: bool = field(default=False, metadata=flag("Replace an existing bundle.", kind=Kind.SWITCH))
    calibration_samples: int | None = field(default=None, metadata=flag(
        "Use a deterministic subset of N samples.", kind=Kind.INT, minimum=1, metavar="N"))
    labels: Path | None = field(default=None, metadata=flag("Class names, one a line.", kind=Kind.PATH))
    device_eval: int | None = field(default=None, metadata=flag(
        "Carry the first N held-out samples (inputs, labels, the float model's outputs) for `edgetk check --eval`; "
        "they reach a device only when a check asks.", kind=Kind.INT, minimum=1, metavar="N"))
    weights: Path | None = field(default=None, metadata=flag(
        "State dict for a PyTorch factory source.", kind=Kind.PATH))
    targets_dirs: tuple[Path, ...] = field(default=(), metadata=flag(
        "Extra folder of target profiles (repeatable).", kind=Kind.PATH, name="--targets-dir", multiple=True))
    dynamic_batch: bool = field(default=False, metadata=flag(
        "Keep the batch dimension dynamic where the route can.", kind=Kind.SWITCH))
    io_dtype: IoDtype | None = field(default=None, metadata=flag(
        "Input/output type of TFLite INT8 artifacts (default int8).", kind=Kind.CHOICE, words="IoDtype"))
    calibration_method: CalibrationMethod | None = field(default=None, metadata=flag(
        "ONNX static INT8 calibration method.", kind=Kind.CHOICE, words="CalibrationMethod"))
    threads: int | None = field(default=None, metadata=flag(
        "Threads for host timing (default: the profile's).", kind=Kind.INT, minimum=1))
    task: str | None = field(default=None, metadata=flag(
        "What the model does; picks the verification metrics (default: the eval data's dataset.toml, else "
        "inferred from the outputs; the manifest says which).", kind=Kind.CHOICE, choices=_task_names))
    output_tasks: tuple[str, ...] = field(default=(), metadata=flag(
        "What one output carries, judged by its own metrics (repeatable; default: the eval data's dataset.toml "
        "[outputs.NAME], else inferred per output; a CTC sequence takes ,blank=N, an ordinal histogram "
        ",bin=WIDTH,unit=NAME, a raw detector head (detection-head) ,layout=n_5c|n_4c|4c_n,boxes=cxcywh|xyxy|grid).",
        name="--output-task",
        multiple=True, metavar="NAME=TASK"))
    metric: str | None = field(default=None, metadata=flag(
        "Your own verification metric: fn(reference, artifact, labels) -> {name: value, 'ok': bool}; it judges "
        "the outputs it covers (all, or those listed in fn.outputs) in place of the built-in limits.",
        metavar="FILE.py:FN"))
    use_cache: bool = field(default=True, metadata=flag(
        "Convert again even if a cached result exists.", kind=Kind.SWITCH, name="--no-cache", inverted=True))
    # A folder where built artifacts are kept and reused by later runs with the same source, data, recipe and
    # tool versions (conversion is the slow part; verification always runs again). None: build everything.
    workdir: Path | None = None

    def __post_init__(self) -> None:
        words_to_members(self)

    def to_config(self) -> JsonDict:
        """The replayable options (paths as given)."""
        from pathlib import Path

        out: JsonDict = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = [str(v) if isinstance(v, Path) else v for v in value]
            elif isinstance(value, Mapping):
                value = {k: list(v) for k, v in value.items()}
            out[f.name] = value
        return out


@dataclass(frozen=True, kw_only=True)
class DeviceOptions:
    """Which devices a command works on and how to reach them."""

    # each a spec string or a resolved toolkit.devices.spec.DeviceSpec (devices/ reads them; model/ is below it)
    devices: tuple[object, ...] = field(default=(), metadata=flag(
        "local, user@host[:port], an ~/.ssh/config alias or an inventory name (repeatable).", name="--device",
        multiple=True, metavar="SPEC"))
    inventory: Path | None = field(default=None, metadata=flag(
        "Inventory of devices: TOML ([devices.NAME] tables), or an Ansible inventory (hosts.ini, hosts.yml, a "
        "directory; needs edge-toolkit[ansible]).", kind=Kind.PATH))
    group: str | None = field(default=None, metadata=flag("Only the inventory's devices in this group."))
    limit: str | None = field(default=None, metadata=flag(
        "Only the Ansible inventory's hosts matching this Ansible host pattern (e.g. 'lab:&arm64:!pi-3').",
        metavar="PATTERN"))
    parallel: int = field(default=8, metadata=flag(
        "Devices handled at once.", kind=Kind.INT, minimum=1, maximum=256, show_default=True))
    trust_new_host: bool = field(default=False, metadata=flag(
        "Accept and record the host key of a device not in known_hosts (changed keys are always refused).",
        kind=Kind.SWITCH))
    known_hosts: Path | None = field(default=None, metadata=flag(
        "known_hosts file to verify against (default ~/.ssh/known_hosts).", kind=Kind.PATH))
    device_home: str | None = field(default=None, metadata=flag(
        "Where the toolkit keeps its files on these devices (default ~/.edgetk; the inventory's `home` per "
        "device): a writable place on a device with a read-only root, e.g. /data/edgetk.", metavar="DIR"))

    def __post_init__(self) -> None:
        if not 1 <= self.parallel <= 256:
            raise UsageError(f"--parallel must be between 1 and 256, got {self.parallel}.")


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    """How a check runs on the device and what it is gated against."""

    runs: int = field(default=50, metadata=flag(
        "Timed runs per artifact.", kind=Kind.INT, minimum=1, show_default=True))
    warmup: int = field(default=5, metadata=flag(
        "Untimed runs first.", kind=Kind.INT, minimum=0, show_default=True))
    budget_ms: float | None = field(default=None, metadata=flag(
        "p90 latency budget in ms (default: the bundle's target profile budget).", kind=Kind.FLOAT))
    baseline: str = field(default="last", metadata=flag(
        "Regression baseline: last (last passing check), none, or a CHECK_ID.", show_default=True))
    regression_pct: float | None = field(default=None, metadata=flag(
        "Smallest p50 slowdown against the baseline, in percent, that counts as a regression (default: the "
        "bundle's check policy).", kind=Kind.FLOAT, minimum=0))
    store: str | None = field(default=None, metadata=flag(
        "Check history: a file (SQLite) or postgresql://USER@HOST:PORT/DB (default $EDGETK_STORE or "
        "~/.local/share/edgetk/history.sqlite).", metavar="PATH|URL"))
    store_fallback: bool = field(default=False, metadata=flag(
        "When the history database is unavailable, keep the results in a local file for `edgetk history sync`.",
        kind=Kind.SWITCH))
    profile: bool = field(default=False, metadata=flag(
        "Also profile each artifact per operator on the device, and where its nodes ran (delegate/provider vs "
        "CPU fallback).", kind=Kind.SWITCH))
    throughput: bool = field(default=False, metadata=flag(
        "Also measure inferences/s at several batch sizes (dynamic batch) or requests in flight.",
        kind=Kind.SWITCH))
    loads: bool = field(default=False, metadata=flag(
        "Also measure cold, warm and optimized loads (ORT optimized model, XNNPACK weight cache), each with its "
        "first inference.", kind=Kind.SWITCH))
    evaluate: bool = field(default=False, metadata=flag(
        "Also run the bundle's eval set (convert --device-eval) on the device and score it against the labels and "
        "the float model.", kind=Kind.SWITCH, name="--eval"))

    def __post_init__(self) -> None:
        if self.runs < 1 or self.warmup < 0:
            raise UsageError(f"--runs must be at least 1 and --warmup at least 0 (got {self.runs} and "
                             f"{self.warmup}).")
        from toolkit.model.policy import GateOptions

        GateOptions(budget_ms=self.budget_ms, baseline=self.baseline, regression_pct=self.regression_pct)


@dataclass(frozen=True, kw_only=True)
class RolloutOptions:
    """A staged rollout (``deploy --waves``): batch sizes, the failure threshold, and what happens when it is
    passed (``toolkit.api.rollout``)."""

    waves: str | None = field(default=None, metadata=flag(
        "Deploy in waves: batch sizes, each a count or a share of the fleet; the last repeats (e.g. 1,10%,100%).",
        metavar="SIZES"))
    max_failures: str = field(default="0", metadata=flag(
        "Stop the rollout after a wave in which more devices than this failed (a count or a percentage).",
        metavar="N|PCT", show_default=True))
    rollback_on_failure: bool = field(default=False, metadata=flag(
        "When the rollout stops, switch the devices it updated back to their previous version.", kind=Kind.SWITCH))

    def __post_init__(self) -> None:
        from toolkit.model.waves import FailureLimit, WavePlan

        if self.waves is not None:
            WavePlan.parse(self.waves)
        FailureLimit.parse(self.max_failures)
