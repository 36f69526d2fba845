"""What the verbs return: one frozen record per verb, each with the ``to_dict()`` that is its CLI ``--json``
document, and the small types the verbs share (paths, progress callbacks)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeAlias, TypeVar

from toolkit.errors import worst_exit_code
from toolkit.model.answers import DeviceAnswer
from toolkit.model.records import JsonDict, JsonObject

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.api.rollout import BundleOutcome, RolloutResult
    from toolkit.checks.selection import Selection
    from toolkit.conversion.layers import LayerTable
    from toolkit.conversion.pipeline import ConvertResult
    from toolkit.delivery.push import PushResult
    from toolkit.devices.spec import DeviceSpec
    from toolkit.model.targets import TargetProfile
    from toolkit.model.device_records import CheckReport
    from toolkit.model.manifest import Manifest
    from toolkit.runtimes.inspection import ModelInfo
    from toolkit.store import StoredCheck, Trend
    from toolkit.store.guard import StoreStatus


PathLike = str | Path
DeviceLike: TypeAlias = "str | DeviceSpec"
Progress = Callable[[str], None]
A = TypeVar("A", bound=DeviceAnswer | None)  # the verb's answer (toolkit.model.answers); None: deploy and check


@dataclass(frozen=True)
class DeviceResult(Generic[A]):
    """One device's outcome: installed (``push``), checked (``reports``), the verb's typed ``answer``
    (rollback, status, remove, prune, probe, setup, add-key: :mod:`toolkit.model.answers`), or the error that
    stopped it (``answer`` is then None)."""

    device: str
    ok: bool
    error: str | None
    exit_code: int
    push: PushResult | None = None
    reports: tuple[CheckReport, ...] = ()
    answer: A | None = None
    selected: Selection | None = None  # the artifact this device selected by its check (toolkit.checks.selection)

    def to_dict(self) -> JsonDict:
        """The device's entry of the CLI's ``--json`` document (docs/schemas/deploy.md)."""
        out: JsonDict = {
            "device": self.device,
            "ok": self.ok,
            "error": self.error,
            "reports": [r.to_dict() for r in self.reports],
        }
        if self.push is not None:
            out["deploy"] = self.push.to_dict()
        if self.selected is not None:
            out["selected"] = self.selected.to_dict()
        if self.answer is not None:
            out.update(self.answer.to_dict())
        return out


@dataclass(frozen=True)
class FleetReport(Generic[A]):
    """What ``deploy``/``check``/``rollback``/``status``/``remove``/``prune``/``probe``/``setup``/``add_key`` did
    on every device; ``A`` is the verb's answer type (``FleetReport[StatusAnswer]``; None for deploy and check)."""

    devices: tuple[DeviceResult[A], ...]
    store: StoreStatus | None = None  # where the check reports went (deploy --check, check)
    rollout: RolloutResult[BundleOutcome] | None = None  # deploy --waves: the waves, why it stopped, the rollback

    @property
    def exit_code(self) -> int:
        codes = [d.exit_code for d in self.devices]
        if self.store is not None and not self.store.ok:
            codes.append(4)  # the history could not be reached: a device-class failure, as for a device
        if self.rollout is not None and self.rollout.stopped:
            codes.append(1)
        return worst_exit_code(codes)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def succeeded(self) -> tuple[DeviceResult[A], ...]:
        return tuple(d for d in self.devices if d.ok)

    @property
    def failed(self) -> tuple[DeviceResult[A], ...]:
        return tuple(d for d in self.devices if not d.ok)

    @property
    def reports(self) -> tuple[CheckReport, ...]:
        return tuple(r for d in self.devices for r in d.reports)

    def to_dict(self) -> JsonDict:
        """``{"passed", "devices": [...]}``: the document ``edgetk deploy|check --json`` prints."""
        doc: JsonDict = {"passed": self.passed, "devices": [d.to_dict() for d in self.devices]}
        if self.store is not None:
            doc["store"] = self.store.to_dict()
        if self.rollout is not None:
            doc["rollout"] = self.rollout.to_dict()
        return doc


@dataclass(frozen=True)
class BundleInspection:
    """``inspect`` of a bundle directory: its manifest and every artifact's inspection."""

    bundle: Path
    manifest: Manifest
    artifacts: tuple[ModelInfo, ...]
    layers: Mapping[str, LayerTable] | None = None  # inspect(layers=True): artifact file -> its layer-wise table

    def to_dict(self) -> JsonDict:
        doc = {
            "bundle": str(self.bundle),
            "manifest": self.manifest.to_dict(),
            "artifacts": [a.to_dict() for a in self.artifacts],
        }
        if self.layers is not None:
            doc["layers"] = {file: table.to_dict() for file, table in self.layers.items()}
        return doc


@dataclass(frozen=True)
class RunResult:
    """``run``: the bundle that convert made, then what deploy and check did on every device.

    ``failed_stage`` is None when every stage passed, else ``"deploy"`` or ``"check"`` (a failed convert
    raises instead, as ``convert`` does). ``exit_code`` is that stage's code.
    """

    converted: ConvertResult
    deployed: FleetReport[None] | None
    checked: FleetReport[None] | None
    config: JsonObject = field(default_factory=dict)

    @property
    def failed_stage(self) -> str | None:
        if self.deployed is not None and not self.deployed.passed:
            return "deploy"
        if self.checked is not None and not self.checked.passed:
            return "check"
        return None

    @property
    def exit_code(self) -> int:
        if self.deployed is not None and not self.deployed.passed:
            return self.deployed.exit_code
        return self.checked.exit_code if self.checked is not None else 0

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def bundle_dir(self) -> Path:
        return self.converted.bundle_dir

    @property
    def manifest(self) -> Manifest:
        return self.converted.manifest

    @property
    def devices(self) -> tuple[DeviceResult[None], ...]:
        """Per device: its push and its check reports merged (as the CLI prints them)."""
        checked = {d.device: d for d in self.checked.devices} if self.checked else {}
        out = []
        for dep in self.deployed.devices if self.deployed else ():
            chk = checked.get(dep.device)
            if chk is None:
                out.append(dep)
                continue
            out.append(DeviceResult(dep.device, chk.ok, chk.error, chk.exit_code, push=dep.push, reports=chk.reports))
        return tuple(out)

    def to_dict(self) -> JsonDict:
        """The document ``edgetk run --json`` prints (docs/schemas/run.md)."""
        return {
            "passed": self.passed,
            "exit_code": self.exit_code,
            "failed_stage": self.failed_stage,
            "bundle": str(self.converted.bundle_dir),
            "cached": self.converted.cached,
            "config": dict(self.config),
            "manifest": self.converted.manifest.to_dict(),
            "devices": [d.to_dict() for d in self.devices],
        }


@dataclass(frozen=True)
class TargetCatalog:
    """``list_targets``: every profile, shipped and the user's."""

    profiles: tuple[TargetProfile, ...]

    def to_dict(self) -> list[JsonDict]:
        """The document ``edgetk targets list --json`` prints: a list of profile summaries
        (docs/schemas/targets.md)."""
        return [
            {
                "name": p.name,
                "arch": p.arch,
                "description": p.description,
                "source": p.origin,
                "path": str(p.path) if p.path else None,
                "extends": p.extends,
                "preferred_recipe": p.preferred_recipe.label,
                "latency_budget_ms": p.latency_budget_ms,
                "edgetpu": p.edgetpu,
            }
            for p in self.profiles
        ]


@dataclass(frozen=True)
class TargetView:
    """``show_target``: one resolved profile (extends applied) and where it came from."""

    profile: TargetProfile

    def to_dict(self) -> JsonDict:
        """The document ``edgetk targets show NAME --json`` prints."""
        data = dict(self.profile.to_dict())
        data["source"] = self.profile.origin
        return data


@dataclass(frozen=True)
class History:
    """``history``: the stored checks that match, oldest first, and the p50 trend per device/bundle/artifact."""

    checks: tuple[StoredCheck, ...]

    @property
    def trends(self) -> list[Trend]:
        from toolkit.store import trends

        return trends(list(self.checks))

    def to_dict(self) -> list[JsonDict]:
        """The document ``edgetk history --json`` prints: a list of stored check reports."""
        return [c.to_dict() for c in self.checks]
