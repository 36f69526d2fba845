"""What the target profile says, as the convert stage uses it (:class:`Policy`, read once per run by
:func:`policy_for`): the recipes, the tolerance, threads, the runtimes' bounds, the accelerators, the check gate."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolkit.verification import verify
from toolkit.model.policy import CheckPolicy
from toolkit.model.targets import check_policy_from_profile
from toolkit.model.recipe import Recipe
from toolkit.model.vocabulary import AcceleratorKind, Precision, Runtime, TFLITE_RUNTIMES

if TYPE_CHECKING:
    from toolkit.model.targets import TargetProfile


@dataclass(frozen=True)
class Policy:
    """What the target profile says, as the convert stage uses it."""

    name: str
    arch: str | None
    recipes: tuple[Recipe, ...]
    tolerance: verify.Tolerance
    threads: int
    max_opset: int | None
    preferences: Mapping[str, Any]  # Any: the manifest's JSON values (runtimes, threads, budget)
    fallback: tuple[Precision, ...] = ()  # precisions to fall back along, ending in fp32
    tflite_bounds: tuple[tuple[str, str | None], ...] = ()  # (runtime, max_version) of the TFLite runtimes
    edgetpu: bool = False
    delegate: str | None = None  # the Edge TPU delegate library, for the compiled artifact's record
    provider_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # Any: raw TOML values
    check: CheckPolicy | None = None  # what check gates the bundle on, written into its manifest
    onnxruntime_min: str | None = None  # the oldest onnxruntime the profile's devices may run


def policy_for(profile: TargetProfile, *, threads: int | None = None) -> Policy:
    """The policy of ``profile``; ``threads`` (the user's ``--threads``) wins over the profile's."""
    return Policy(
        name=profile.name,
        arch=profile.arch,
        recipes=tuple(profile.recipes),
        tolerance=profile.tolerance,
        threads=threads or min(profile.threads or 2, os.cpu_count() or 2),
        max_opset=profile.max_onnx_opset,
        preferences={
            "runtimes": [r.name for r in profile.runtimes],
            "execution_providers": list(profile.execution_providers or ()),
            "threads": profile.threads,
            "latency_budget_ms": profile.latency_budget_ms,
        },
        fallback=tuple(profile.fallback),
        tflite_bounds=tuple((r.name, r.max_version) for r in profile.runtimes if r.name in TFLITE_RUNTIMES),
        edgetpu=profile.edgetpu,
        delegate=next((a.delegate for a in profile.accelerators if a.kind == AcceleratorKind.EDGETPU and a.delegate), None),
        provider_options={k: dict(v) for k, v in profile.provider_options.items()},
        check=check_policy_from_profile(profile),
        onnxruntime_min=next((r.min_version for r in profile.runtimes if r.name == Runtime.ONNXRUNTIME), None),
    )
