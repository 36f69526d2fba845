"""What each optimization step changed: frozen dataclasses with ``to_dict`` for ``--json`` and the API."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ModelFigures:
    """Measured figures of one model state.

    ``params`` counts every weight; ``nonzero_params`` those not exactly zero. ``file_bytes`` is the model as
    written in the source's format, ``gzip_bytes`` that file gzip-compressed (level 9: what pruning and
    clustering buy on the wire). ``latency_ms`` is the host median for one sample in the model's framework.
    ``macs`` counts the multiply-accumulates of conv and dense layers for one sample. ``accuracy`` is top-1 on
    the eval data (``None`` without labelled eval data).
    """

    params: int
    nonzero_params: int
    file_bytes: int
    gzip_bytes: int
    latency_ms: float
    macs: int
    accuracy: float | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class StepReport:
    """One technique applied: its settings, what it measured on the way, and the model's figures after it."""

    technique: str
    settings: dict[str, object]
    details: dict[str, object]
    figures: ModelFigures
    fine_tuned: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "technique": self.technique,
            "settings": dict(self.settings),
            "details": dict(self.details),
            "fine_tuned": self.fine_tuned,
            "figures": self.figures.to_dict(),
        }


@dataclass(frozen=True)
class OptimizationReport:
    """The float baseline, every step in the order it ran, and where the optimized model was written."""

    source: str
    framework: str
    output: str
    output_format: str
    baseline: ModelFigures
    steps: tuple[StepReport, ...] = field(default_factory=tuple)

    @property
    def final(self) -> ModelFigures:
        return self.steps[-1].figures if self.steps else self.baseline

    def to_dict(self) -> dict[str, object]:
        final = self.final
        return {
            "source": self.source,
            "framework": self.framework,
            "output": self.output,
            "output_format": self.output_format,
            "baseline": self.baseline.to_dict(),
            "steps": [step.to_dict() for step in self.steps],
            "final": final.to_dict(),
            "change": {
                "params_ratio": _ratio(final.params, self.baseline.params),
                "nonzero_params_ratio": _ratio(final.nonzero_params, self.baseline.nonzero_params),
                "file_ratio": _ratio(final.file_bytes, self.baseline.file_bytes),
                "gzip_ratio": _ratio(final.gzip_bytes, self.baseline.gzip_bytes),
                "latency_ratio": _ratio(final.latency_ms, self.baseline.latency_ms),
                "accuracy_delta": None if final.accuracy is None or self.baseline.accuracy is None
                else round(final.accuracy - self.baseline.accuracy, 4),
            },
        }

    def table(self) -> str:
        """A plain text table for the terminal."""
        rows = [("baseline", self.baseline)] + [(s.technique, s.figures) for s in self.steps]
        head = f"{'step':<14}{'params':>10}{'nonzero':>10}{'file KB':>10}{'gzip KB':>10}{'ms':>8}{'MACs':>10}{'acc':>8}"
        lines = [head]
        for name, f in rows:
            acc = "-" if f.accuracy is None else f"{f.accuracy:.3f}"
            lines.append(f"{name:<14}{f.params:>10}{f.nonzero_params:>10}{f.file_bytes / 1024:>10.1f}"
                         f"{f.gzip_bytes / 1024:>10.1f}{f.latency_ms:>8.3f}{f.macs:>10}{acc:>8}")
        lines.append(f"written: {self.output} ({self.output_format})")
        return "\n".join(lines)


def _ratio(a: float, b: float) -> float | None:
    return None if not b else round(a / b, 4)
