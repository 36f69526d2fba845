"""The report's plots, drawn with matplotlib's Agg backend (no display needed) into PNG bytes.

- latency: per artifact and device, the distribution the runner measured. The runner reports percentiles, not
  raw samples, so each box spans p50..p90, the whiskers min..p99, and a dot marks the max.
- trade-off: accuracy (or top-1 agreement with the float model) against size, one marker per artifact, coloured
  by precision and labelled with its latency (device p50 when checked, else host latency).
- trend: p50 over time per device and artifact, from the check history.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any  # Any: JSON values of stored checks, read by key

from toolkit.errors import MissingDependency
from toolkit.model.quantized import precision_label
from toolkit.model.manifest import Manifest
from toolkit.model.vocabulary import Format

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

PRECISION_COLOURS = {"fp32": "#4c72b0", "fp16": "#55a868", "dynamic": "#dd8452", "int8": "#c44e52"}


def _pyplot() -> ModuleType:
    try:
        import matplotlib
    except ImportError:
        raise MissingDependency("matplotlib", extra="report", purpose="to draw the HTML report's plots") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Figure) -> bytes:
    plt = _pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def latency_plot(reports: Sequence[Mapping[str, Any]]) -> bytes | None:
    """Box per (artifact, device) from the runner's percentiles; None when nothing was measured."""
    measured = [r for r in reports if r.get("latency_ms")]
    if not measured:
        return None
    plt = _pyplot()
    stats = []
    for r in measured:
        lat = r["latency_ms"]
        stats.append({
            "label": f"{r.get('artifact')}\n{r.get('device')}",
            "med": lat["p50"], "q1": lat["p50"], "q3": lat["p90"], "whislo": lat["min"], "whishi": lat["p99"],
            "fliers": [lat["max"]], "mean": lat["mean"],
        })
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(stats)), 4.2))
    ax.bxp(stats, showmeans=True, showfliers=True, patch_artist=True,
           boxprops={"facecolor": "#c6dbef"}, flierprops={"marker": "o", "markersize": 4})
    ax.set_ylabel("latency (ms)")
    ax.set_title("Device latency per artifact (box p50-p90, whiskers min-p99, dot max, triangle mean)")
    ax.grid(axis="y", alpha=0.3)
    plt.setp(ax.get_xticklabels(), fontsize=8)
    return _png(fig)


def tradeoff_plot(manifest: Manifest, reports: Sequence[Mapping[str, Any]]) -> bytes | None:
    """Accuracy vs size, coloured by precision, labelled with latency; None without verified artifacts."""
    points = []
    device_p50: dict[str, float] = {}
    for r in reports:
        lat = r.get("latency_ms")
        if lat:
            device_p50.setdefault(str(r.get("artifact")), float(lat["p50"]))
    for a in manifest.artifacts:
        v = a.verification
        if v is None:
            continue
        if v.accuracy is not None:
            y, metric = v.accuracy, "accuracy"
        elif v.top1_agreement is not None:
            y, metric = v.top1_agreement, "top-1 agreement with float"
        else:
            y, metric = v.cosine_similarity, "cosine similarity to float"
        latency = device_p50.get(a.file, a.host_latency_ms)
        where = "device" if a.file in device_p50 else "host"
        points.append((a, a.bytes / 1024, y, metric, latency, where))
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    labels_at: dict[tuple[float, float], list[str]] = {}  # points that (nearly) coincide share one label
    span = max(p[1] for p in points) or 1.0
    for a, size, y, _metric, latency, where in points:
        marker = "o" if a.format == Format.TFLITE else "s"
        ax.scatter(size, y, s=90, marker=marker, color=PRECISION_COLOURS.get(a.precision, "#8172b3"),
                   edgecolors="black", linewidths=0.5, label=f"{precision_label(a.precision, a.recipe, a.quantized)} {a.format}", alpha=0.85)
        text = a.file if latency is None else f"{a.file}: {latency:.3f} ms ({where})"
        anchor = next((k for k in labels_at if abs(k[0] - size) < 0.08 * span and abs(k[1] - y) < 1e-3), (size, y))
        labels_at.setdefault(anchor, []).append(text)
    for (size, y), texts in labels_at.items():
        ax.annotate("\n".join(texts), (size, y), textcoords="offset points", xytext=(8, -4), fontsize=7,
                    va="top", ha="left" if size < 0.6 * span else "right")
    reference = next((a.verification.reference_accuracy for a, *_ in points
                      if a.verification and a.verification.reference_accuracy is not None), None)
    if reference is not None and points[0][3] == "accuracy":
        ax.axhline(reference, color="grey", linestyle="--", linewidth=0.8, label="float model")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="lower right")
    ax.margins(x=0.15, y=0.3)
    ax.set_xlabel("size (KB)")
    ax.set_ylabel(points[0][3])
    ax.set_title("Accuracy vs size vs latency per precision")
    ax.grid(alpha=0.3)
    return _png(fig)


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text)  # Python 3.11 reads a trailing Z


def trend_plot(checks: Sequence[Mapping[str, Any]]) -> bytes | None:
    """p50 over time, one line per (device, artifact); None when the history holds no latency."""
    series: dict[tuple[str, str], list[tuple[datetime, float, bool]]] = {}
    for c in checks:
        lat = c.get("latency_ms")
        if not lat or not c.get("created_at"):
            continue
        key = (str(c.get("device")), str(c.get("artifact")))
        series.setdefault(key, []).append((_when(str(c["created_at"])), float(lat["p50"]), bool(c.get("passed"))))
    if not series:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for (device, artifact), points in sorted(series.items()):
        points.sort()
        xs = [p[0] for p in points]
        ax.plot(xs, [p[1] for p in points], marker="o", markersize=4, label=f"{artifact} @ {device}")
        failed = [p for p in points if not p[2]]
        if failed:
            ax.scatter([p[0] for p in failed], [p[1] for p in failed], marker="x", color="red", s=60, zorder=3)
    ax.set_ylabel("p50 latency (ms)")
    ax.set_title("Trend over the check history (red x: a failed check)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.autofmt_xdate()
    return _png(fig)


# ------------------------------------------------------------------------------------------ inside a run


def newest_with(checks: Sequence[Mapping[str, Any]], key: str) -> list[Mapping[str, Any]]:
    """The newest check per (device, artifact) that holds ``key`` (profile, throughput, loads), oldest first in."""
    newest: dict[tuple[str, str], Mapping[str, Any]] = {}
    for c in checks:
        if isinstance(c.get(key), Mapping) and not c[key].get("error"):
            newest[(str(c.get("device")), str(c.get("artifact")))] = c
    return [newest[k] for k in sorted(newest)]


def _precision_of(artifact: str) -> str:
    parts = artifact.split(".")
    return parts[1] if len(parts) >= 3 else artifact


def operator_plot(checks: Sequence[Mapping[str, Any]], *, top: int = 8) -> bytes | None:
    """Time per inference of the top operator types, the artifacts of one format on one device side by side
    (fp32 next to int8 of the same model: which operators did not get faster). Where a runtime gives no
    per-operator times (TFLite's Python interpreters) the bars count nodes instead; None without profiles."""
    profiled = newest_with(checks, "profile")
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for c in profiled:
        fmt = str(c.get("artifact", "")).rsplit(".", 1)[-1]
        groups.setdefault((str(c.get("device")), fmt), []).append(c)
    if not groups:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(groups), 1, figsize=(8.5, 0.5 + 2.9 * len(groups)), squeeze=False)
    for ax, ((device, fmt), items) in zip(axes[:, 0], sorted(groups.items())):
        # times where the runtime gave them (ONNX Runtime); else node counts (TFLite's Python interpreters)
        field, unit = (("time_ms", "time per inference (ms)") if all(c["profile"].get("available") for c in items)
                       else ("nodes", "nodes (this runtime gives no per-operator times)"))
        worst: dict[str, float] = {}
        for c in items:
            for t in c["profile"].get("by_op_type") or []:
                name = str(t.get("op_type"))
                worst[name] = max(worst.get(name, 0.0), float(t.get(field) or 0.0))
        ops = sorted(worst, key=lambda n: -worst[n])[:top][::-1]
        height = 0.8 / max(len(items), 1)
        for k, c in enumerate(items):
            times = {str(t.get("op_type")): float(t.get(field) or 0.0) for t in c["profile"]["by_op_type"]}
            precision = _precision_of(str(c.get("artifact")))
            colour = PRECISION_COLOURS.get(precision, "#8172b3")
            ys = [i + k * height for i in range(len(ops))]
            ax.barh(ys, [times.get(op, 0.0) for op in ops], height=height, color=colour, label=str(c.get("artifact")))
            if field == "nodes":  # the nodes that stayed on the CPU kernels, hatched over their bar
                intended = str((c.get("placement") or {}).get("intended"))
                off = {str(t.get("op_type")): sum(n for where, n in (t.get("on") or {}).items() if where != intended)
                       for t in c["profile"]["by_op_type"]}
                ax.barh(ys, [off.get(op, 0) for op in ops], height=height, color="white", edgecolor=colour,
                        hatch="///", label=f"{c.get('artifact')}: not on {intended}" if any(off.values()) else None)
        ax.set_yticks([i + height * (len(items) - 1) / 2 for i in range(len(ops))])
        ax.set_yticklabels(ops, fontsize=8)
        ax.set_xlabel(unit)
        ax.set_title(f"Top operators, {fmt} artifacts on {device}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return _png(fig)


def throughput_plot(checks: Sequence[Mapping[str, Any]]) -> bytes | None:
    """The latency-throughput curve per artifact and device: p50 of one call against inferences/s, each point
    labelled with its batch size (or requests in flight); None when no throughput was measured."""
    measured = newest_with(checks, "throughput")
    if not measured:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for c in measured:
        curve = c["throughput"]
        points = curve.get("points") or []
        key, label = ("batch", "b") if curve.get("mode") == "batch" else ("in_flight", "x")
        xs = [float(p.get("inferences_per_s") or 0.0) for p in points]
        ys = [float((p.get("latency_ms") or {}).get("p50") or 0.0) for p in points]
        precision = _precision_of(str(c.get("artifact")))
        ax.plot(xs, ys, marker="o" if curve.get("mode") == "batch" else "s", markersize=5,
                color=PRECISION_COLOURS.get(precision), label=f"{c.get('artifact')} @ {c.get('device')}")
        for x, y, p in zip(xs, ys, points):
            ax.annotate(f"{label}{p.get(key)}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("inferences per second")
    ax.set_ylabel("latency of one call, p50 (ms)")
    ax.set_title("Latency vs throughput (b: batch size, x: requests in flight)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return _png(fig)
