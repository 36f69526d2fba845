"""``edgetk deploy | check | rollback | status | remove``: bundles on devices (``toolkit.api.deploy``, ``check``,
``rollback``, ``status``, ``remove``; ``edgetk prune`` is in ``prune_cmd``).

Each command resolves its devices (``--device`` / ``--inventory`` / ``--group``), runs one task per device in
parallel (``--parallel``), and prints a per-device table or, with ``--json``, one document::

    {"passed": bool, "devices": [{"device", "ok", "error", "reports": [CHECK REPORT...], ...}]}

Each device's error also goes to stderr, with or without ``--json``; the worst device's exit code wins (4,
else 2, else 1, else 0: docs/cli.md). Heavy modules (paramiko) load only when a device is actually contacted.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any  # Any: click's parsed values; the push and check report documents

import click

from toolkit.cli._fleet import finish
from toolkit.cli.options import PathType, check_options, device_options, json_option, rollout_options

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from toolkit.api.results import DeviceResult
    from toolkit.model.answers import RemoveAnswer, RollbackAnswer, StatusAnswer


break_lock_option = click.option(
    "--break-lock", "break_lock", is_flag=True,
    help="Break the bundle's lock on the device whoever holds it (for a holder that is stuck; a lock whose holder "
    "is gone is broken without it).")


def _render(result: DeviceResult[None]) -> list[str]:
    from toolkit.reporting.terminal import inside_lines, selection_lines  # here: `edgetk --help` stays light

    entry = result.to_dict()  # the push's and the reports' documents, as --json prints them
    lines = []
    push = entry.get("deploy")
    if push:
        lines.append(
            f"{push['name']} {push['version'][:12]} is current: sent {push['files_sent']}/{push['files_total']} files "
            f"({push['bytes_sent'] / 1e6:.2f} MB), reused {push['files_reused']}, {push['seconds']:.2f} s"
        )
        lock = push.get("lock") or {}
        if lock.get("broke"):
            lines.append(f"broke the lock of {lock['broke']}")
        if lock.get("waited_for"):
            replaced = f"; replaced {str(push['previous'])[:12]}" if push.get("previous") else ""
            lines.append(f"waited {lock['waited_s']:.1f} s for {lock['waited_for']}{replaced}"
                         + (f" (installed from {push['previous_by']})" if push.get("previous_by") else ""))
        if push.get("pruned"):
            lines.append(f"removed {len(push['pruned'])} old version(s) to make room: "
                         + ", ".join(v[:12] for v in push["pruned"]))
        lines.extend(f"warning: {w}" for w in push.get("warnings") or [])
    for r in entry["reports"]:
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
        for note in r["gates"].get("skipped", []):
            lines.append(f"  skipped: {note}")
        lines.extend(inside_lines(r))
        if r.get("throttled"):
            lines.append(f"  throttled: {r['throttled']} (this run decides no selection or regression)")
    lines.extend(selection_lines(entry.get("selected")))
    return lines


@click.command()
@click.argument("bundle", type=PathType())
@device_options
@click.option("--check", "check", is_flag=True, help="Check the bundle on each device after installing it.")
@check_options
@click.option("--force", is_flag=True, help="Deploy even if the bundle's target arch differs from the device's.")
@click.option("--compress", is_flag=True,
              help="Send files gzip-compressed where that saves >= 10% (the device inflates and verifies them).")
@click.option("--prune", "prune", is_flag=True,
              help="When the device's disk cannot hold the new version, remove old versions first (never the current "
              "one or the rollback target).")
@break_lock_option
@rollout_options
@json_option
def deploy(bundle: Path, as_json: bool, **values: Any) -> None:
    """Push BUNDLE to devices, verify every file there, and make it current (keeps the last 3 versions)."""
    from toolkit import api

    finish(api.deploy(bundle, progress_stream=sys.stderr, **values), as_json=as_json, render=_render)


@click.command()
@click.argument("bundle", type=PathType())
@device_options
@check_options
@click.option("--select", "select", default=None, metavar="FILE",
              help="Pin the artifact FILE as the one each device runs (instead of the fastest that passes there).")
@json_option
def check(bundle: Path, as_json: bool, **values: Any) -> None:
    """Run the deployed BUNDLE on devices: latency, memory, outputs; gate on budget and regression."""
    from toolkit import api

    finish(api.check(bundle, progress_stream=sys.stderr, **values), as_json=as_json, render=_render)


@click.command()
@click.argument("name")
@device_options
@break_lock_option
@json_option
def rollback(name: str, as_json: bool, **values: Any) -> None:
    """Switch bundle NAME back to its previous installed version (verified first)."""
    from toolkit import api

    def render(result: DeviceResult[RollbackAnswer]) -> list[str]:
        back = result.answer
        return [f"{name}: current is now {back.current[:12]} (was {back.previous[:12]})"] if back else []

    finish(api.rollback(name, **values), as_json=as_json, render=render)


def _render_status(result: DeviceResult[StatusAnswer]) -> list[str]:
    from toolkit.reporting.terminal import labelled  # here: `edgetk --help` stays light

    bundles = result.answer.bundles if result.answer is not None else {}
    if not bundles and result.ok:
        return ["no bundles installed"]
    lines = []
    for bname, info in bundles.items():
        for v in info.versions:
            mark = "*" if v.version == info.current else " "
            host = v.by.host if v.by is not None else None
            lines.append(f"{mark} {bname} {v.version[:12]} installed {v.installed_at}"
                         + (f" from {host}" if host else ""))
        chosen = info.current_selection
        if chosen:
            p50 = chosen.get("p50_ms")
            name = chosen.get("artifact")
            lines.append(f"  selected: {labelled(name, chosen.get('label')) if name else 'nothing'}"
                         + (f" (p50 {p50:.3f} ms)" if isinstance(p50, (int, float)) else "")
                         + (" [pinned]" if chosen.get("pinned") else "") + f" {chosen.get('decided_at', '')}")
        elif info.selected:
            lines.append(f"  selected: none for the current version (the last selection was for "
                         f"{str(info.selected.get('version'))[:12]}; run edgetk check)")
    return lines


@click.command()
@device_options
@json_option
def status(as_json: bool, **values: Any) -> None:
    """Which bundles and versions are installed on each device, and which version is current."""
    from toolkit import api

    finish(api.status(**values), as_json=as_json, render=_render_status)


@click.command()
@click.argument("name")
@device_options
@break_lock_option
@json_option
def remove(name: str, as_json: bool, **values: Any) -> None:
    """Delete bundle NAME (every version) from devices."""
    from toolkit import api

    def render(result: DeviceResult[RemoveAnswer]) -> list[str]:
        return [f"{result.answer.removed} removed"] if result.answer is not None else []

    finish(api.remove(name, **values), as_json=as_json, render=render)
