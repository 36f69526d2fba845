"""``edgetk report --html``: one self-contained HTML page (inline CSS, plots as base64 PNG ``data:`` URIs, no
scripts, nothing fetched), to open in a browser or attach to a review.

A bundle report holds the manifest facts, the per-bundle table (host measurements beside the latest check on
each device), the latency and trade-off plots, and the trend of that bundle's history. A ``--history`` report
holds the trend plot and table of every stored check. :func:`collect` gathers the data (also what
``edgetk report --json`` prints); :func:`render_html` draws it.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any  # Any: JSON values of stored checks and table cells of any printable type

from toolkit.__about__ import __version__
from toolkit.model.manifest import Manifest
from toolkit.model.vocabulary import AttemptOutcome


@dataclass(frozen=True)
class ReportData:
    """What a report shows: a bundle (or None for ``--history``), its latest checks, and the history."""

    store: Path | str  # the SQLite file, or a server URL without its password
    bundle_dir: Path | None = None
    manifest: Manifest | None = None
    version: str | None = None
    latest: tuple[Mapping[str, Any], ...] = ()  # newest check run per device, for this bundle version
    history: tuple[Mapping[str, Any], ...] = ()  # stored checks, oldest first
    trends: tuple[Mapping[str, Any], ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    selected: tuple[Mapping[str, Any], ...] = ()  # the newest selection per device (toolkit.checks.selection)

    @property
    def title(self) -> str:
        return f"edgetk report: {self.manifest.name}" if self.manifest else "edgetk report: check history"

    def to_dict(self) -> dict[str, object]:
        """The document ``edgetk report --json`` prints (docs/schemas/report.md)."""
        return {
            "bundle": str(self.bundle_dir) if self.bundle_dir else None,
            "version": self.version,
            "store": str(self.store),
            "manifest": self.manifest.to_dict() if self.manifest else None,
            "latest": [dict(r) for r in self.latest],
            "history": [dict(r) for r in self.history],
            "trends": [dict(t) for t in self.trends],
            "selected": [dict(s) for s in self.selected],
        }


def _latest_per_device(checks: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    newest: dict[str, str] = {}
    for c in checks:  # oldest first: the last run id seen per device is the newest
        newest[str(c.get("device"))] = str(c.get("run_id"))
    return [c for c in checks if newest.get(str(c.get("device"))) == str(c.get("run_id"))]


def collect(bundle: Path | None, *, store: Path | str | None = None, device: str | None = None) -> ReportData:
    """Read the bundle (if any) and its stored checks; without a bundle, the whole history."""
    from toolkit.store import Store, trends
    from toolkit.store.selections import latest_selections

    history_store = Store(store)
    if bundle is None:
        checks = history_store.history(device=device)
        return ReportData(
            store=history_store.path, history=tuple(c.to_dict() for c in checks),
            trends=tuple(t.to_dict() for t in trends(checks)),
            selected=tuple(latest_selections(history_store, device=device)),
        )
    from toolkit.delivery.bundle import read_bundle

    opened = read_bundle(Path(bundle))
    checks = history_store.history(device=device, bundle=opened.name)
    this_version = [c.to_dict() for c in checks if c.version == opened.version]
    return ReportData(
        store=history_store.path, bundle_dir=Path(bundle), manifest=opened.manifest, version=opened.version,
        latest=tuple(_latest_per_device(this_version)), history=tuple(c.to_dict() for c in checks),
        trends=tuple(t.to_dict() for t in trends(checks)),
        selected=tuple(s for s in latest_selections(history_store, bundle=opened.name, device=device)
                       if s.get("version") == opened.version),
    )


# --------------------------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 24px 32px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.meta { color: #666; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f5f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.PASS { color: #1a7f37; font-weight: bold; } .FAIL, .ERROR { color: #cf222e; font-weight: bold; }
img.plot { display: block; max-width: 100%; margin: 8px 0 16px; border: 1px solid #eee; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; font-size: 13px; }
dt { font-weight: bold; } dd { margin: 0; }
code { font-size: 12px; }
"""


def _e(value: object) -> str:
    return html.escape("-" if value is None else str(value))


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, css_id: str, verdict_col: int | None = None,
           numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            classes = []
            if i == verdict_col:
                classes.append(str(cell))
            if i in numeric:
                classes.append("num")
            attr = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{attr}>{_e(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="{css_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _img(png: bytes | None, alt: str, css_id: str) -> str:
    if png is None:
        return f'<p class="meta" id="{css_id}-missing">No data for this plot yet ({_e(alt)}).</p>'
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="plot" id="{css_id}" alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _facts(data: ReportData) -> str:
    m = data.manifest
    if m is None:
        return ""
    facts: list[tuple[str, object]] = [
        ("name", m.name), ("bundle", data.bundle_dir), ("version", (data.version or "")[:16]),
        ("created", m.created_at), ("toolkit", m.toolkit_version),
        ("source", f"{m.source.path} ({m.source.framework}, sha256 {m.source.sha256[:12]})"),
        ("target", f"{m.target.name or '-'} ({m.target.arch or 'any arch'})"),
        ("calibration", f"{m.calibration.path} ({m.calibration.samples} samples)" if m.calibration else None),
        ("preprocessing", ", ".join(f"{k}={v}" for k, v in m.preprocessing.to_dict().items() if v is not None)
         if m.preprocessing else None),
        ("labels", f"{len(m.labels)} classes" if m.labels else None),
        ("runner", m.runner.file if m.runner else None),
    ]
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
    dropped = [a for a in m.attempts if a.outcome != AttemptOutcome.KEPT]
    extra = ""
    if dropped:
        rows = [(a.recipe.brief,
                 a.outcome, a.reason, a.workaround or "")
                for a in dropped]
        extra = "<h3>Recipes not shipped</h3>" + _table(("recipe", "outcome", "reason", "workaround"), rows,
                                                        css_id="not-shipped")
    return f'<h2>Manifest</h2><dl id="manifest">{items}</dl>{extra}'


def _history_rows(checks: Sequence[Mapping[str, Any]]) -> list[list[object]]:
    rows = []
    for c in checks:
        lat = c.get("latency_ms") or {}
        rows.append([
            str(c.get("created_at", ""))[:19], c.get("check_id"), c.get("device"), c.get("bundle"), c.get("artifact"),
            f"{lat['p50']:.3f}" if lat else "-", f"{lat['p90']:.3f}" if lat else "-",
            "PASS" if c.get("passed") else "FAIL",
        ])
    return rows


def _inside(data: ReportData) -> str:
    """Placement, per-operator profiles, throughput and loads of this bundle version (newest per device and
    artifact that measured each); empty when no check asked for them."""
    from toolkit.reporting import plots
    from toolkit.reporting.terminal import ms_text

    checks = [c for c in data.history if c.get("version") == data.version] or list(data.latest)
    parts: list[str] = []
    placed = [c for c in plots.newest_with(checks, "placement") if c["placement"].get("nodes_total") is not None]
    if placed:
        rows = []
        for c in placed:
            p = c["placement"]
            share = p.get("time_share_on_intended")
            rows.append([c.get("artifact"), c.get("device"), p.get("intended"),
                         f"{p.get('nodes_on_intended')}/{p.get('nodes_total')}",
                         f"{100 * float(share):.0f}%" if share is not None else "unknown",
                         ", ".join(str(o) for o in p.get("fallback_ops") or []) or "-"])
        parts.append("<h2>Where the nodes ran</h2>")
        parts.append(_table(("artifact", "device", "intended", "nodes on it", "time on it", "fell back"), rows,
                            css_id="placement"))
    profiled = plots.newest_with(checks, "profile")
    if profiled:
        parts.append("<h2>Operators</h2>")
        parts.append(_img(plots.operator_plot(checks), "top operators per artifact", "plot-operators"))
        untimed = sorted({str(c["profile"].get("note")) for c in profiled if not c["profile"].get("available")})
        parts.extend(f'<p class="meta">{_e(note)}</p>' for note in untimed)
    if plots.newest_with(checks, "throughput"):
        parts.append("<h2>Throughput</h2>")
        parts.append(_img(plots.throughput_plot(checks), "latency vs throughput", "plot-throughput"))
    loaded = plots.newest_with(checks, "loads")
    if loaded:

        def pair(entry: Any) -> str:
            entry = entry or {}
            return f"{ms_text(entry.get('load_ms'))} + {ms_text(entry.get('first_inference_ms'))}"

        rows = []
        for c in loaded:
            loads = c["loads"]
            cache = (loads.get("cold") or {}).get("page_cache") or {}
            cold = pair(loads.get("cold")) + ("" if cache.get("dropped") else " (cache not dropped)")
            for option in loads.get("options") or [{}]:
                after = ("n/a" if option.get("available") is False
                         else f"{pair(option.get('before'))} -> {pair(option.get('after'))}")
                rows.append([c.get("artifact"), c.get("device"), cold, pair(loads.get("warm")),
                             option.get("name", "-"), after])
        parts.append("<h2>Loads (load + first inference)</h2>")
        parts.append(_table(("artifact", "device", "cold", "warm", "option", "before -> after"), rows,
                            css_id="loads"))
    evaluated = plots.newest_with(checks, "evaluation")
    if evaluated:
        from toolkit.reporting.terminal import eval_row

        parts.append("<h2>The eval set on the device</h2>")
        parts.append(_table(("artifact", "device", "samples", "device vs labels", "float vs labels",
                             "device vs float", "note"), [eval_row(c) for c in evaluated], css_id="evaluation"))
    return "".join(parts)


def selection_rows(selected: Sequence[Mapping[str, Any]]) -> list[list[object]]:
    """One row per device's newest selection: the artifact (with its label), its p50 there, pinned, why, the
    proposal."""
    from toolkit.reporting.terminal import labelled

    return [[s.get("device"), s.get("bundle"),
             labelled(s["artifact"], s.get("label")) if s.get("artifact") else "nothing",
             f"{s['p50_ms']:.3f}" if isinstance(s.get("p50_ms"), (int, float)) else "-",
             "yes" if s.get("pinned") else "no", s.get("reason"), s.get("proposed")] for s in selected]


def render_html(data: ReportData) -> str:
    """The whole page as one string."""
    from toolkit.reporting import plots
    from toolkit.reporting.terminal import HEADERS, bundle_rows

    now = datetime.now(UTC).isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(data.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(data.title)}</h1>",
        f'<p class="meta">made {now} by edge-toolkit {_e(__version__)} from {_e(data.store)}</p>',
    ]
    if data.manifest is not None:
        rows = bundle_rows(data.manifest, data.latest)
        parts.append("<h2>Artifacts and checks</h2>")
        if not data.latest:
            parts.append('<p class="meta">No check of this bundle version is stored yet: run '
                         "<code>edgetk check</code> or <code>edgetk run</code> to add device measurements.</p>")
        parts.append(_table(HEADERS, rows, css_id="artifacts", verdict_col=len(HEADERS) - 1, numeric=(4, 6, 7, 8, 9)))
    if data.selected:
        parts.append("<h2>Selected on each device</h2>")
        parts.append(_table(("device", "bundle", "selected", "p50 ms", "pinned", "why", "proposed by the manifest"),
                            selection_rows(data.selected), css_id="selected", numeric=(3,)))
    if data.manifest is not None:
        parts.append("<h2>Latency on the devices</h2>")
        parts.append(_img(plots.latency_plot(data.latest), "latency distribution per artifact and device",
                          "plot-latency"))
        parts.append("<h2>Accuracy, size and latency</h2>")
        parts.append(_img(plots.tradeoff_plot(data.manifest, data.latest), "accuracy vs size vs latency",
                          "plot-tradeoff"))
        parts.append(_inside(data))
        parts.append(_facts(data))
    parts.append("<h2>Trend over the history</h2>")
    parts.append(_img(plots.trend_plot(data.history), "p50 trend over the check history", "plot-trend"))
    if data.trends:
        trend_rows = [
            [t["device"], t["bundle"], t["artifact"], t["checks"], t["passed"],
             f"{t['first_p50_ms']:.3f}" if t.get("first_p50_ms") is not None else "-",
             f"{t['last_p50_ms']:.3f}" if t.get("last_p50_ms") is not None else "-",
             f"{t['change_pct']:+.1f}%" if t.get("change_pct") is not None else "-"]
            for t in data.trends
        ]
        parts.append(_table(("device", "bundle", "artifact", "checks", "passed", "first p50 ms", "last p50 ms",
                             "change"), trend_rows, css_id="trends", numeric=(3, 4, 5, 6, 7)))
    parts.append("<h2>Stored checks</h2>")
    parts.append(_table(("created", "check id", "device", "bundle", "artifact", "p50 ms", "p90 ms", "gate"),
                        _history_rows(data.history), css_id="history", verdict_col=7, numeric=(5, 6)))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(data: ReportData, out: Path) -> Path:
    """Render and write atomically (a failed render leaves no half page)."""
    out = Path(out)
    page = render_html(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out
