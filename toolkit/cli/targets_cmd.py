"""``edgetk targets list|show``: the device profiles, shipped and the user's, and where each came from
(``toolkit.api.list_targets`` / ``show_target``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from toolkit.cli._output import emit
from toolkit.cli.options import PathType

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from toolkit.model.targets import TargetProfile

_targets_dir_option = click.option(
    "--targets-dir",
    "targets_dirs",
    multiple=True,
    type=PathType(),
    help="A folder of your own <name>.toml profiles (repeatable; wins over shipped ones of the same name).",
)


@click.group("targets")
def targets() -> None:
    """Device profiles: what each target runs best (recipes, runtimes, budget, tolerance)."""


@targets.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (a list of profiles).")
@_targets_dir_option
def list_targets(as_json: bool, targets_dirs: tuple[Path, ...]) -> None:
    """List every target profile: name, arch, preferred recipe, latency budget, where it came from."""
    from toolkit import api

    rows = api.list_targets(targets_dirs=targets_dirs).to_dict()
    if as_json:
        emit(rows)
        return
    header = ("NAME", "ARCH", "PREFERRED RECIPE", "BUDGET", "SOURCE")
    table = [header] + [
        (r["name"], r["arch"], r["preferred_recipe"], f"{r['latency_budget_ms']:g} ms",
         r["source"] if r["source"] == "shipped" else f"user: {r['path']}")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


@targets.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the resolved profile as one JSON document.")
@_targets_dir_option
def show_target(name: str, as_json: bool, targets_dirs: tuple[Path, ...]) -> None:
    """Show one resolved profile (extends applied) and the file it came from."""
    from toolkit import api

    view = api.show_target(name, targets_dirs=targets_dirs)
    if as_json:
        emit(view.to_dict())
        return
    click.echo(_render(view.profile))


def _render(p: TargetProfile) -> str:
    lines = [f"{p.name}: {p.description}"]
    origin = f"{p.origin} ({p.path})"
    if p.extends:
        origin += f", extends {p.extends}"
        if len(p.lineage) > 1:
            origin += " from " + " <- ".join(p.lineage[1:])
    lines += [
        f"  source:            {origin}",
        f"  arch:              {p.arch}",
        f"  cpu:               {p.cpu.cores}x {p.cpu.model}",
        f"  memory:            {p.memory_mb} MB",
        f"  os / python:       {p.os} / Python {p.python}",
        "  runtimes:          " + "; ".join(f"{r.name} {r.bounds}" + (f" ({r.note})" if r.note else "")
                                          for r in p.runtimes),
    ]
    if p.accelerators:
        for accel in p.accelerators:
            needs = accel.delegate or ", ".join(accel.execution_providers) or "-"
            lines.append(f"  accelerator:       {accel.name} [{accel.kind}] via {needs}")
    if p.execution_providers:
        lines.append(f"  providers:         {', '.join(p.execution_providers)}")
    for ep, options in p.provider_options.items():
        lines.append(f"    {ep}: " + ", ".join(f"{k}={v}" for k, v in options.items()))
    lines += [
        f"  max onnx opset:    {p.max_onnx_opset if p.max_onnx_opset is not None else '- (no ONNX)'}",
        f"  threads:           {p.threads}",
        f"  latency budget:    {p.latency_budget_ms:g} ms",
        f"  tolerance:         top-1 drop <= {p.tolerance.max_top1_drop:g}, cosine >= {p.tolerance.min_cosine:g}",
        f"  fallback:          {' -> '.join(p.fallback)}",
        f"  edge tpu:          {'yes (edgetpu_compiler)' if p.edgetpu else 'no'}",
        "  recipes (in order of preference):",
    ]
    lines += [f"    {i}. {r.label}" + (" (only when 8-bit int8 loses accuracy)" if r.a16w8 else "")
              for i, r in enumerate(p.recipes, 1)]
    if p.sources:
        lines.append("  sources:")
        lines += [f"    {s}" for s in p.sources]
    return "\n".join(lines)
