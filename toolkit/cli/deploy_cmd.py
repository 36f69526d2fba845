"""``edgetk deploy | check | rollback | status | remove``: bundles on devices (issue 5).

Each command resolves its devices (``--device`` / ``--inventory`` / ``--group``), runs one task per device in
parallel (``--parallel``), and prints a per-device table or, with ``--json``, one document::

    {"passed": bool, "devices": [{"device", "ok", "error", "reports": [CHECK REPORT...], ...}]}

Exit code: the worst device wins (4 device error, else 2 usage, else 1 gate failed, else 0). Heavy modules
(paramiko) load only when a device is actually contacted.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from toolkit.cli._fleet import DeviceEntry, Selection, device_options, finish, resolve_devices
from toolkit.devices.fleet import FleetResult
from toolkit.devices.spec import DeviceSpec


@dataclass(frozen=True)
class _Done:
    push: Any = None  # deployment.PushResult
    reports: tuple[Any, ...] = ()  # CheckReport
    data: Any = None


def _check_options(func: Any) -> Any:
    options = [
        click.option("--runs", type=click.IntRange(1), default=50, show_default=True, help="Timed runs per artifact."),
        click.option("--warmup", type=click.IntRange(0), default=5, show_default=True, help="Untimed runs first."),
        click.option("--budget-ms", type=float, default=None,
                     help="p90 latency budget in ms (default: the bundle's target profile budget)."),
        click.option("--baseline", default="last", show_default=True,
                     help="Regression baseline: last (last passing check), none, or a CHECK_ID."),
        click.option("--regression-pct", type=click.FloatRange(0), default=10.0, show_default=True,
                     help="Allowed p50 slowdown against the baseline, in percent."),
        click.option("--store", type=click.Path(path_type=Path), default=None,
                     help="Check history file (default $EDGETK_STORE or ~/.local/share/edgetk/history.sqlite)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _entries(result: FleetResult[_Done], extra: Any = None) -> list[DeviceEntry]:
    entries = []
    for outcome in result.outcomes:
        done = outcome.value
        reports = [r.to_dict() for r in done.reports] if done else []
        failed_gates = [r for r in (done.reports if done else ()) if not r.gates.passed]
        code = outcome.exit_code or (1 if failed_gates else 0)
        error = outcome.error
        if error is None and failed_gates:
            error = "; ".join(reason for r in failed_gates for reason in r.gates.reasons if not reason.startswith("skipped"))
        entry = DeviceEntry(outcome.device, code == 0, error, code, reports)
        if done is not None and done.push is not None:
            entry.extra["deploy"] = done.push.to_dict()
        if done is not None and extra is not None:
            entry.extra.update(extra(done))
        entries.append(entry)
    return entries


def _render(entry: DeviceEntry) -> list[str]:
    lines = []
    push = entry.extra.get("deploy")
    if push:
        lines.append(
            f"{push['name']} {push['version'][:12]} is current: sent {push['files_sent']}/{push['files_total']} files "
            f"({push['bytes_sent'] / 1e6:.2f} MB), reused {push['files_reused']}, {push['seconds']:.2f} s"
        )
    for r in entry.reports:
        lat = r.get("latency_ms") or {}
        match = r.get("outputs_match") or {}
        runtime = r.get("runtime") or {}
        if r.get("error"):
            lines.append(f"{r['artifact']}: could not run ({r['error'].get('kind')}): {r['error'].get('message')}")
            if r["error"].get("hint"):
                lines.append(f"  hint: {r['error']['hint']}")
            continue
        gate = "PASS" if r["gates"]["passed"] else "FAIL"
        lines.append(
            f"{gate} {r['artifact']:<22} {runtime.get('name')} {runtime.get('version')}  "
            f"p50 {lat.get('p50', float('nan')):.3f} ms  p90 {lat.get('p90', float('nan')):.3f} ms  "
            f"load {r.get('load_ms') or 0:.1f} ms  rss {r.get('peak_rss_mb') or 0:.0f} MB  "
            f"outputs {'ok' if match.get('ok') else 'MISMATCH'}  [{r.get('check_id')}]"
        )
        for reason in r["gates"]["reasons"]:
            lines.append(f"  {reason}")
    return lines


def _run_bundle_task(
    selection: Selection, bundle_path: Path, *, deploy: bool, check: bool, force: bool, runs: int, warmup: int,
    budget_ms: float | None, baseline: str, regression_pct: float, store: Path | None, compress: bool = False,
) -> list[DeviceEntry]:
    from toolkit.deployment import Device
    from toolkit.rollout import prepare_job

    job = prepare_job(bundle_path, install=deploy, check=check, force=force, compress=compress, runs=runs,
                      warmup=warmup, budget_ms=budget_ms, baseline=baseline, regression_pct=regression_pct,
                      store=store)

    def task(spec: DeviceSpec) -> _Done:
        with selection.open(spec) as conn:
            pushed, reports = job.run(Device(spec, conn), progress_stream=sys.stderr)
            return _Done(push=pushed, reports=tuple(reports))

    return _entries(selection.run(task))


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@device_options
@click.option("--check", "do_check", is_flag=True, help="Check the bundle on each device after installing it.")
@_check_options
@click.option("--force", is_flag=True, help="Deploy even if the bundle's target arch differs from the device's.")
@click.option("--compress", is_flag=True,
              help="Send files gzip-compressed where that saves >= 10% (the device inflates and verifies them).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def deploy(bundle: Path, devices: Sequence[str], inventory: Path | None, group: str | None, parallel: int,
           trust_new_host: bool, known_hosts: Path | None, do_check: bool, runs: int, warmup: int,
           budget_ms: float | None, baseline: str, regression_pct: float, store: Path | None, force: bool,
           compress: bool, as_json: bool) -> None:
    """Push BUNDLE to devices, verify every file there, and make it current (keeps the last 3 versions)."""
    selection = resolve_devices(devices, inventory, group, parallel, trust_new_host, known_hosts)
    entries = _run_bundle_task(
        selection, bundle, deploy=True, check=do_check, force=force, runs=runs, warmup=warmup,
        budget_ms=budget_ms, baseline=baseline, regression_pct=regression_pct, store=store, compress=compress,
    )
    finish(entries, as_json=as_json, render=_render)


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@device_options
@_check_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def check(bundle: Path, devices: Sequence[str], inventory: Path | None, group: str | None, parallel: int,
          trust_new_host: bool, known_hosts: Path | None, runs: int, warmup: int, budget_ms: float | None,
          baseline: str, regression_pct: float, store: Path | None, as_json: bool) -> None:
    """Run the deployed BUNDLE on devices: latency, memory, outputs; gate on budget and regression."""
    selection = resolve_devices(devices, inventory, group, parallel, trust_new_host, known_hosts)
    entries = _run_bundle_task(
        selection, bundle, deploy=False, check=True, force=False, runs=runs, warmup=warmup,
        budget_ms=budget_ms, baseline=baseline, regression_pct=regression_pct, store=store,
    )
    finish(entries, as_json=as_json, render=_render)


def _simple(selection: Selection, action: Any) -> FleetResult[_Done]:
    from toolkit.deployment import Device

    def task(spec: DeviceSpec) -> _Done:
        with selection.open(spec) as conn:
            return _Done(data=action(Device(spec, conn)))

    return selection.run(task)


@click.command()
@click.argument("name")
@device_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def rollback(name: str, devices: Sequence[str], inventory: Path | None, group: str | None, parallel: int,
             trust_new_host: bool, known_hosts: Path | None, as_json: bool) -> None:
    """Switch bundle NAME back to its previous installed version (verified first)."""
    from toolkit.deployment import rollback as do_rollback

    selection = resolve_devices(devices, inventory, group, parallel, trust_new_host, known_hosts)
    result = _simple(selection, lambda device: do_rollback(device, name))
    entries = _entries(result, extra=lambda done: dict(done.data))

    def render(entry: DeviceEntry) -> list[str]:
        if entry.extra.get("current"):
            return [f"{name}: current is now {entry.extra['current'][:12]} (was {str(entry.extra['previous'])[:12]})"]
        return []

    finish(entries, as_json=as_json, render=render)


@click.command()
@device_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def status(devices: Sequence[str], inventory: Path | None, group: str | None, parallel: int,
           trust_new_host: bool, known_hosts: Path | None, as_json: bool) -> None:
    """Which bundles and versions are installed on each device, and which version is current."""
    from toolkit.deployment import status as do_status

    selection = resolve_devices(devices, inventory, group, parallel, trust_new_host, known_hosts)
    entries = _entries(_simple(selection, do_status), extra=lambda done: {"bundles": done.data.get("bundles", {})})

    def render(entry: DeviceEntry) -> list[str]:
        bundles = entry.extra.get("bundles") or {}
        if not bundles and entry.ok:
            return ["no bundles installed"]
        lines = []
        for bname, info in bundles.items():
            for v in info["versions"]:
                mark = "*" if v["version"] == info["current"] else " "
                lines.append(f"{mark} {bname} {v['version'][:12]} installed {v['installed_at']}")
        return lines

    finish(entries, as_json=as_json, render=render)


@click.command()
@click.argument("name")
@device_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def remove(name: str, devices: Sequence[str], inventory: Path | None, group: str | None, parallel: int,
           trust_new_host: bool, known_hosts: Path | None, as_json: bool) -> None:
    """Delete bundle NAME (every version) from devices."""
    from toolkit.deployment import remove as do_remove

    selection = resolve_devices(devices, inventory, group, parallel, trust_new_host, known_hosts)
    entries = _entries(_simple(selection, lambda device: do_remove(device, name)), extra=lambda done: dict(done.data))
    finish(entries, as_json=as_json, render=lambda e: [f"{name} removed"] if e.ok else [])
