"""One bundle deployed and/or checked on one device: the unit of work that ``edgetk deploy``/``check`` and
``toolkit.deploy``/``toolkit.check`` hand to the fleet runner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from toolkit.bundle import Bundle, read_bundle
from toolkit.checking import GateOptions
from toolkit.errors import UsageError
from toolkit.store import Store
from toolkit.types import CheckReport


@dataclass(frozen=True)
class BundleJob:
    """What to do with ``bundle`` on each device: install it (``install``), then check it (``check``)."""

    bundle: Bundle
    install: bool
    check: bool
    force: bool
    compress: bool
    runs: int
    warmup: int
    gates: GateOptions
    store: Store | None

    def run(self, device: Any, *, progress_stream: TextIO | Any | None) -> tuple[Any, list[CheckReport]]:
        """(push result or None, check reports) for one connected ``toolkit.deployment.Device``."""
        from toolkit.checking import check as run_check
        from toolkit.deployment import push

        pushed = (
            push(device, self.bundle, force=self.force, progress_stream=progress_stream, compress=self.compress)
            if self.install
            else None
        )
        reports = (
            run_check(device, self.bundle, runs=self.runs, warmup=self.warmup, gates=self.gates, store=self.store)
            if self.check
            else []
        )
        return pushed, list(reports)


def prepare_job(
    bundle_path: str | Path,
    *,
    install: bool,
    check: bool,
    force: bool = False,
    compress: bool = False,
    runs: int,
    warmup: int,
    budget_ms: float | None,
    baseline: str,
    regression_pct: float,
    store: str | Path | None,
) -> BundleJob:
    """Read and validate the bundle and the gate options once, before any device is contacted."""
    from toolkit.deployment import validate_name

    bundle = read_bundle(Path(bundle_path))
    validate_name(bundle.name)
    history = Store(Path(store) if store is not None else None) if check else None
    if history is not None and baseline not in ("last", "none") and not history.exists(baseline):
        raise UsageError(
            f"No stored check {baseline!r} in {history.path}.",
            hint="Use --baseline last, none, or an id from `edgetk history`.",
        )
    return BundleJob(
        bundle=bundle,
        install=install,
        check=check,
        force=force,
        compress=compress,
        runs=runs,
        warmup=warmup,
        gates=GateOptions(budget_ms=budget_ms, baseline=baseline, regression_pct=regression_pct),
        store=history,
    )
