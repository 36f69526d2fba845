"""The device chooses: which of a bundle's artifacts a device runs, decided by that device's own check.

The manifest's ``preferred`` artifact is the profile's proposal; host latency cannot rank artifacts for another
CPU (toolkit.conversion.host_timing). :func:`choose` selects, for that device, the fastest artifact that passed
verification at convert time (an ``unverified`` one only where no verified one passes) and passes its gates
there; inside each other's noise (:func:`toolkit.regression.compare` both ways), the smallest file wins.
Stickiness, pinning and throttled runs: docs/verification.md. The selection is written on the device as
``selected.json`` beside ``current`` (:func:`on_device`), in the history, and in every check's report.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from toolkit.errors import UsageError, VersionReplaced
from toolkit.model.policy import RegressionPolicy
from toolkit.model.records import JsonDict, JsonObject
from toolkit.regression import MIN_SAMPLES, Difference, compare
from toolkit.model.runner_report import throttled
from toolkit.model.artifact import ArtifactRecord
from toolkit.model.device_records import CheckReport
from toolkit.model.manifest import Manifest
from toolkit.model.quantized import label_beyond
from toolkit.model.vocabulary import ArtifactStatus

if TYPE_CHECKING:  # pragma: no cover
    from toolkit.delivery.bundle import Bundle
    from toolkit.delivery.deployment import Device
    from toolkit.store import Store

SELECT_WAIT_S = 120.0  # how long writing the selection waits on the device for another controller's push
# statuses that passed verification at convert time; UNVERIFIED (verification proved nothing) is in the running
# only where no verified artifact is
SELECTABLE = (ArtifactStatus.OK, ArtifactStatus.NO_SPEEDUP_MEASURED, ArtifactStatus.SLOWER)
# the regression gate's test and minimum effects (alpha 0.01, 25%, 0.2 ms): artifacts are measured in separate
# runner processes (why that needs them: toolkit.model.policy.RegressionPolicy)
_GATE = RegressionPolicy()
ALPHA, MIN_PCT, MIN_MS = _GATE.alpha, _GATE.min_slowdown_pct, _GATE.min_slowdown_ms


@dataclass(frozen=True)
class Contender:
    """One artifact as the selection saw it: its p50 on the device and why it could not be selected."""

    artifact: str
    bytes: int
    p50_ms: float | None
    excluded: str | None = None  # None: it passed and was in the running
    label: str | None = None  # its precision where the file name says too little (``int8 mixed: 2% of weights int``)

    def to_dict(self) -> JsonDict:
        return {"artifact": self.artifact, "bytes": self.bytes, "p50_ms": self.p50_ms, "excluded": self.excluded,
                "label": self.label}


@dataclass(frozen=True)
class Selection:
    """The artifact one device runs for one installed version (``artifact`` None: nothing passed)."""

    device: str
    bundle: str
    version: str
    artifact: str | None
    reason: str
    pinned: bool = False
    runtimes: Mapping[str, str] = field(default_factory=dict)  # runtime -> version the check saw
    contenders: tuple[Contender, ...] = ()
    proposed: str | None = None  # the manifest's preferred artifact (the profile's proposal)
    decided_at: str = ""
    changed: bool = True  # False: the previous selection stood

    @property
    def p50_ms(self) -> float | None:
        return next((c.p50_ms for c in self.contenders if c.artifact == self.artifact), None)

    @property
    def label(self) -> str | None:
        return next((c.label for c in self.contenders if c.artifact == self.artifact), None)

    def to_dict(self) -> JsonDict:
        """The ``selected`` entry of a device in ``check``/``deploy --check``/``run`` --json (docs/schemas)."""
        return {
            "artifact": self.artifact, "label": self.label, "reason": self.reason, "pinned": self.pinned,
            "version": self.version, "p50_ms": self.p50_ms, "proposed": self.proposed, "changed": self.changed,
            "runtimes": dict(self.runtimes), "decided_at": self.decided_at,
            "contenders": [c.to_dict() for c in self.contenders],
        }

    def on_device(self) -> JsonDict:
        """``selected.json`` on the device: what an application there needs to load the selected model."""
        doc = self.to_dict()
        doc.update({"bundle": self.bundle, "path": f"{self.version}/{self.artifact}" if self.artifact else None})
        return doc


def runtimes_seen(reports: Sequence[CheckReport]) -> dict[str, str]:
    """The runtimes the check ran on the device (name -> version): a change re-does the selection."""
    seen: dict[str, str] = {}
    for report in reports:
        name, version = (report.runtime or {}).get("name"), (report.runtime or {}).get("version")
        if report.error is None and name:
            seen[str(name)] = str(version)
    return dict(sorted(seen.items()))


def _contender(report: CheckReport | None, record: ArtifactRecord) -> Contender:
    verified = record.status in (*SELECTABLE, ArtifactStatus.UNVERIFIED)
    p50 = report.latency_ms.p50 if verified and report is not None and report.latency_ms else None
    return Contender(record.file, int(record.bytes), p50, _excluded(report, record, p50),
                     label_beyond(record.precision, record.recipe, record.quantized))


def _excluded(report: CheckReport | None, record: ArtifactRecord, p50: float | None) -> str | None:
    """Why ``record`` cannot be selected on this device (None: it is in the running)."""
    if record.status not in (*SELECTABLE, ArtifactStatus.UNVERIFIED):
        return f"did not pass verification at convert time ({record.status})"
    if report is None:
        return "not measured by this check"
    if report.error:
        return f"the device cannot run it: {report.error.get('kind')}: {report.error.get('message')}"
    if not report.gates.passed:
        return "; ".join(report.gates.failures) or "its gates failed"
    why = throttled(report.environment or {})
    if why:
        return f"measured while the device throttled: {why}"
    return "no latency was measured" if p50 is None else None


def _faster(a: CheckReport, b: CheckReport) -> bool:
    """``a`` measurably faster than ``b`` on the device (rank test + minimum effects); with fewer than
    MIN_SAMPLES samples a side (``--runs 3``) no rank test can say anything: the minimum effects alone decide."""
    if min(len(a.latency_samples_ms), len(b.latency_samples_ms)) < MIN_SAMPLES:
        pa, pb = a.latency_ms.p50, b.latency_ms.p50  # type: ignore[union-attr]
        return pb > pa * (1.0 + MIN_PCT / 100.0) and pb - pa > MIN_MS
    difference, _, _ = compare(a.latency_samples_ms, b.latency_samples_ms, alpha=ALPHA, min_pct=MIN_PCT,
                               min_ms=MIN_MS)
    return difference is Difference.FASTER


def choose(reports: Sequence[CheckReport], manifest: Manifest, *, device: str, version: str,
           previous: JsonObject | None = None, pin: str | None = None) -> Selection:
    """Select the artifact ``device`` runs, from this check's gated ``reports`` (module docstring).

    ``previous``: the device's ``selected.json`` (or None); ``pin``: the file the user pins (``--select``)."""
    files = [a.file for a in manifest.artifacts]
    if pin is not None and pin not in files:
        raise UsageError(f"--select {pin}: the bundle has no artifact of that name.",
                         hint=f"Pick one of: {', '.join(files)}.")
    by_file = {r.artifact: r for r in reports}
    contenders = tuple(_contender(by_file.get(a.file), a) for a in manifest.artifacts)
    statuses = {a.file: a.status for a in manifest.artifacts}
    if any(c.excluded is None and statuses[c.artifact] != ArtifactStatus.UNVERIFIED for c in contenders):
        contenders = tuple(dataclasses.replace(c, excluded="unverified at convert time, and a verified artifact "
                                               "passes here") if c.excluded is None and
                           statuses[c.artifact] == ArtifactStatus.UNVERIFIED else c for c in contenders)
    running = {c.artifact: by_file[c.artifact] for c in contenders if c.excluded is None}
    runtimes = runtimes_seen(reports)
    proposed = next((a.file for a in manifest.artifacts if a.preferred), None)
    same = bool(previous) and previous.get("version") == version  # type: ignore[union-attr]
    base = dict(device=device, bundle=manifest.name, version=version, runtimes=runtimes, contenders=contenders,
                proposed=proposed, decided_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    held = pin or (previous.get("artifact") if same and previous and previous.get("pinned") else None)
    note = ""
    if held is not None:
        contender = next(c for c in contenders if c.artifact == held) if held in files else None
        if contender is not None and not (contender.excluded or "").startswith("the device cannot run it"):
            return Selection(artifact=held, reason=f"pinned by the user (edgetk check --select {held})", pinned=True,
                             changed=pin is not None or not same, **base)  # type: ignore[arg-type]
        note = f"the pin on {held} was dropped: it cannot run here; "
    if not running:
        why = "; ".join(f"{c.artifact}: {c.excluded}" for c in contenders)
        return Selection(artifact=None, reason=note + f"no artifact passes on this device ({why})",
                         **base)  # type: ignore[arg-type]
    fastest = min(running, key=lambda f: (running[f].latency_ms.p50, f))  # type: ignore[union-attr]
    ties = [f for f in running if f == fastest or not _faster(running[fastest], running[f])]
    sizes = {c.artifact: c.bytes for c in contenders}
    winner = min(ties, key=lambda f: (sizes[f], f))
    p50 = {f: running[f].latency_ms.p50 for f in running}  # type: ignore[union-attr]
    if len(ties) > 1:
        reason = (f"the smallest of {len(ties)} artifacts within the noise of the fastest ("
                  + ", ".join(f"{f} p50 {p50[f]:.3f} ms" for f in sorted(ties, key=p50.__getitem__)) + ")")
    else:
        reason = f"the fastest that passes here (p50 {p50[winner]:.3f} ms)"
    kept = previous.get("artifact") if previous and same and previous.get("runtimes") == runtimes else None
    if kept in running and kept != winner and not _faster(running[winner], running[kept]):
        return Selection(artifact=kept, reason=note + f"kept: no artifact is measurably faster here (p50 "
                         f"{p50[kept]:.3f} ms; {reason.split(' (')[0]} was {winner})", changed=False,
                         **base)  # type: ignore[arg-type]
    changed = not (previous and same and previous.get("artifact") == winner)
    return Selection(artifact=winner, reason=note + reason, changed=changed, **base)  # type: ignore[arg-type]


def write_selection(device: Device, name: str, selection: Selection) -> None:
    """``selected.json`` on the device: a compare-and-swap on the installed version, under the bundle's lock there
    (``cmd_select`` in the device helper). When another controller installed another version since this check
    began, raise :class:`~toolkit.errors.VersionReplaced` naming it and its deploy's host and pid."""
    import json

    from toolkit.delivery.deployment import HelperRefused
    from toolkit.delivery.locks import describe, installer, request
    from toolkit.model.vocabulary import HelperRefusal

    try:  # the device waits up to SELECT_WAIT_S for a push in progress; this call's own timeout is longer
        device.helper("select", name, json.dumps(selection.on_device()),
                      request("selection", version=selection.version), str(SELECT_WAIT_S),
                      timeout=SELECT_WAIT_S + 60)
    except HelperRefused as refused:
        found = refused.data.get("owner")
        owner: JsonObject = found if isinstance(found, dict) else {}
        if refused.kind is HelperRefusal.LOCKED and owner.get("what") in (None, "deploy"):
            # another controller is installing: its version will replace this one
            raise VersionReplaced(
                f"version {selection.version[:12]} of {name} is being replaced by "
                f"{describe(refused.data.get('owner'), name)} (it held the lock for {SELECT_WAIT_S:.0f} s after "
                "this check); that version's check decides.",
                hint="This check's reports are in the history; its selection was not written.") from None
        if refused.kind is not HelperRefusal.NOT_CURRENT:
            raise
        current = refused.data.get("current")
        deployer = refused.data.get("by")
        by = str(current)[:12] + (f" (deploy from {deployer['host']}, pid {deployer.get('pid')})"
                                  if isinstance(deployer, dict) and installer(deployer) else "")
        if not current:
            raise VersionReplaced(f"version {selection.version[:12]} of {name} was removed from the device before its "
                                  "check finished; nothing was selected.",
                                  hint="Deploy it again (edgetk deploy --check).") from None
        raise VersionReplaced(
            f"version {selection.version[:12]} of {name} was replaced by {by} before its check finished; "
            f"{str(current)[:12]}'s check decides.",
            hint="This check's reports are in the history; its selection was not written. Re-run the deploy to "
            "install this version again.") from None


def apply(device: Device, bundle: Bundle, reports: Sequence[CheckReport], *, pin: str | None = None,
          store: Store | None = None) -> Selection:
    """Select on ``device`` (a connected ``toolkit.delivery.deployment.Device``) from this check's gated ``reports`` of
    ``bundle``: read its previous ``selected.json``, :func:`choose`, write the new one there, record it in
    ``store`` (a history that is down loses only the record: the check's store status says so)."""
    import json
    import uuid

    from toolkit.store.engine import StoreUnavailable
    from toolkit.store.selections import record_selection

    previous = device.helper("selected", bundle.name).get("selected")
    selection = choose(reports, bundle.manifest, device=device.spec.name, version=bundle.version,
                       previous=previous if isinstance(previous, Mapping) else None, pin=pin)
    write_selection(device, bundle.name, selection)
    if store is not None:
        ids = [r.check_id for r in reports if r.check_id]
        run_id = ids[0].rsplit("-", 1)[0] if ids else uuid.uuid4().hex[:12]
        try:
            record_selection(store, selection.to_dict(), device=device.spec.name, bundle=bundle.name, run_id=run_id)
        except StoreUnavailable:
            pass
    return selection
