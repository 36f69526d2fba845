"""The option groups' keywords as the API takes them, for the type checker: ``**options: Unpack[DeployKeywords]``
lets mypy check every keyword a caller passes (its name and type) where ``**options: Any`` let anything through.

The groups, their defaults and their flags are defined once, as frozen dataclasses in
:mod:`toolkit.model.options` (which also builds the CLI's flags and checks the keywords at run time); these
TypedDicts only say what a caller may pass for each field (a path as ``str`` or ``Path``, a sequence for a
tuple, a vocabulary word as its string), and tests/cli/test_front_door.py keeps their keys equal to the
groups' fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from toolkit.api.results import DeviceLike, PathLike

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.model.vocabulary import CalibrationMethod, Format, IoDtype, Precision


class ConvertKeywords(TypedDict, total=False):
    """``ConvertOptions``: what ``convert`` (and ``run``) take besides the source."""

    target: str | None
    calibration: PathLike | None
    eval_data: PathLike | None
    precisions: Sequence[Precision | str]
    formats: Sequence[Format | str]
    input_shapes: Mapping[str, Sequence[int]]
    name: str | None
    out: PathLike | None
    force: bool
    calibration_samples: int | None
    labels: PathLike | None
    device_eval: int | None
    weights: PathLike | None
    targets_dirs: Sequence[PathLike]
    dynamic_batch: bool
    io_dtype: IoDtype | str | None
    calibration_method: CalibrationMethod | str | None
    threads: int | None
    task: str | None
    output_tasks: Sequence[str]
    metric: str | None
    input_values: Sequence[str]
    use_cache: bool


class ReachKeywords(TypedDict, total=False):
    """``DeviceOptions`` but ``devices``: which inventory devices, and how to reach them."""

    inventory: PathLike | None
    group: str | None
    limit: str | None
    parallel: int
    trust_new_host: bool
    known_hosts: PathLike | None
    device_home: str | None


class DeviceKeywords(ReachKeywords, total=False):
    """``DeviceOptions``: the devices (spec strings or ``DeviceSpec`` objects) and how to reach them."""

    devices: Iterable[DeviceLike] | DeviceLike


class CheckKeywords(TypedDict, total=False):
    """``CheckOptions``: how a check runs on the device and what it is gated against."""

    runs: int
    warmup: int
    budget_ms: float | None
    baseline: str
    regression_pct: float | None
    store: PathLike | None
    store_fallback: bool
    profile: bool
    throughput: bool
    loads: bool
    evaluate: bool


class RolloutKeywords(TypedDict, total=False):
    """``RolloutOptions``: a staged rollout (``deploy --waves``)."""

    waves: str | None
    max_failures: str
    rollback_on_failure: bool


class FleetCheckKeywords(DeviceKeywords, CheckKeywords, total=False):
    """``check``: the devices and the check options."""


class DeployKeywords(DeviceKeywords, CheckKeywords, RolloutKeywords, total=False):
    """``deploy``: the devices, the check options (``check=True``) and the rollout."""


class RunKeywords(ConvertKeywords, DeviceKeywords, CheckKeywords, total=False):
    """``run``: convert, the devices and the check options."""
