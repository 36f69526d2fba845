"""The device runner's JSON report read into ungated :class:`CheckReport` records, and what in it says the device
throttled. One reader for every place reports arrive: a check over SSH and the report files a device left
(the Mender update module's, ``edgetk history import``).

Every figure is validated here, before anything records or compares it (:func:`invalid_figure`): latencies
finite and positive with their percentiles in order, counts equal to what was asked, memory positive. A report
that fails becomes a ``bad_report`` error naming the field and its value, with every figure dropped: no
impossible number reaches the history, the regression gate or the selection."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from toolkit.errors import DeviceError
from toolkit.model.device_records import CheckReport, GateResult, LatencyStats
from toolkit.model.records import JsonObject
from toolkit.model.vocabulary import RunnerErrorKind

PERCENTILES = ("min", "p50", "p90", "p99", "max")  # in this order, each at most the next
MAX_SAMPLES = 2000  # the runner's: it thins longer runs evenly to this many samples
_SLACK = 1e-9  # relative: a report's figures are rounded one by one
BAD_REPORT_HINT = ("The device's Python or runner printed figures no real run gives: run the runner by hand there "
                   "(python3 edgetk_runner.py check --bundle DIR) and check that `python` in the inventory is the "
                   "real interpreter.")

HOT_C = 80.0  # Raspberry Pi firmware starts to cap the clock at 80 C; most SoCs throttle in 80-95 C
CAPPED_SHARE = 0.85  # a performance governor running below this share of the maximum clock is capped


def throttled(environment: JsonObject) -> str | None:
    """Why a run with this environment (the runner's ``environment`` section) was taken while the device
    throttled, or None: its hottest thermal zone at or above :data:`HOT_C`, or a ``performance`` governor
    whose current clock is below :data:`CAPPED_SHARE` of its maximum (thermal or power capping)."""
    temp = environment.get("temperature_c")
    if isinstance(temp, (int, float)) and temp >= HOT_C:
        return f"the device was at {temp:g} C (throttling from {HOT_C:g} C)"
    freq, top = environment.get("cpu_freq_mhz"), environment.get("cpu_freq_max_mhz")
    if (environment.get("governor") == "performance" and isinstance(freq, (int, float))
            and isinstance(top, (int, float)) and top > 0 and freq < CAPPED_SHARE * top):
        return f"its CPU ran at {freq:g} of {top:g} MHz under the performance governor (capped)"
    return None


def latency_stats(data: JsonObject | None) -> LatencyStats | None:
    if not data:
        return None
    try:
        return LatencyStats(**{k: float(data[k]) for k in ("mean", "std", "min", "p50", "p90", "p99", "max")})
    except (KeyError, TypeError, ValueError):
        return None


def latency_samples(data: object) -> tuple[float, ...]:
    if not isinstance(data, list):
        return ()
    try:
        return tuple(float(v) for v in data if v is not None)
    except (TypeError, ValueError):
        return ()


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _shown(value: object) -> str:
    """``value`` as JSON writes it (NaN, Infinity), for a message."""
    return json.dumps(value) if isinstance(value, (int, float, str, type(None))) else repr(value)


def _latency_problem(latency: object) -> str | None:
    if not isinstance(latency, dict):
        return f"latency_ms is {_shown(latency)}, not an object"
    values: dict[str, float] = {}
    for key in ("mean", "std", *PERCENTILES):
        value = _number(latency.get(key))
        if value is None or not math.isfinite(value):
            return f"latency_ms.{key} is {_shown(latency.get(key))} (a latency must be a finite number)"
        if value < 0 or (value == 0 and key != "std"):
            return f"latency_ms.{key} is {_shown(value)} (a latency must be positive)"
        values[key] = value
    for low, high in zip(PERCENTILES, PERCENTILES[1:]):
        if values[low] > values[high] * (1 + _SLACK):
            return (f"latency_ms.{low} {values[low]!r} is above latency_ms.{high} {values[high]!r} (percentiles "
                    "must be ordered: min <= p50 <= p90 <= p99 <= max)")
    if not values["min"] * (1 - _SLACK) <= values["mean"] <= values["max"] * (1 + _SLACK):
        return f"latency_ms.mean {values['mean']!r} is outside min..max ({values['min']!r}..{values['max']!r})"
    return None


def expected_samples(runs: int) -> int:
    """How many samples the runner keeps of ``runs`` timed runs (every one, thinned evenly past MAX_SAMPLES)."""
    step = max(1, math.ceil(runs / MAX_SAMPLES))
    return len(range(0, runs, step))


def invalid_figure(item: JsonObject, *, runs: int | None = None, warmup: int | None = None) -> str | None:
    """What in one artifact's report (``item``, as the runner printed it) no real run can give, naming the field
    and its value; None when every figure holds. ``runs``/``warmup``: what the check asked for (None: unknown,
    a report read back from a file). A report with an error carries no figures to check."""
    if item.get("error"):
        return None
    number = _number(item.get("runs"))
    if number is None or not math.isfinite(number) or number != int(number) or number < 1:
        return f"runs is {_shown(item.get('runs'))} (a count of timed runs, at least 1)"
    counted = int(number)
    if runs is not None and counted != runs:
        return f"runs is {counted!r}, but the check asked for {runs}"
    if warmup is not None and item.get("warmup") != warmup:
        return f"warmup is {_shown(item.get('warmup'))}, but the check asked for {warmup}"
    problem = _latency_problem(item.get("latency_ms"))
    if problem:
        return problem
    samples = item.get("latency_samples_ms")
    if samples is not None:
        if not isinstance(samples, list):
            return f"latency_samples_ms is {_shown(samples)}, not a list"
        for i, value in enumerate(samples):
            number = _number(value)
            if number is None or not math.isfinite(number) or number <= 0:
                return f"latency_samples_ms[{i}] is {_shown(value)} (a latency must be finite and positive)"
        if len(samples) != expected_samples(counted):
            return (f"latency_samples_ms holds {len(samples)} samples, but {counted} timed runs give "
                    f"{expected_samples(counted)}")
    for key in ("load_ms", "first_inference_ms"):
        value = item.get(key)
        if value is not None and (_number(value) is None or not math.isfinite(value) or value < 0):
            return f"{key} is {_shown(value)} (a time must be finite and not negative)"
    peak = item.get("peak_rss_mb")
    if peak is not None and (_number(peak) is None or not math.isfinite(peak) or peak <= 0):
        return f"peak_rss_mb is {_shown(peak)} (memory must be finite and positive)"
    return None


def bad_report(artifact: str, problem: str) -> JsonObject:
    """The ``bad_report`` error of an artifact whose report failed :func:`invalid_figure`."""
    return {"kind": RunnerErrorKind.BAD_REPORT.value,
            "message": f"the runner's report for {artifact} is not evidence: {problem}", "hint": BAD_REPORT_HINT}


def parse_runner_output(stdout: str, *, device: str, artifacts: Sequence[str], runs: int | None = None,
                        warmup: int | None = None) -> list[CheckReport]:
    """The runner's JSON -> ungated CheckReports (a top-level error becomes one failed report per artifact).
    Each artifact's figures are validated (:func:`invalid_figure`; ``runs``/``warmup``: what was asked): one
    that fails carries a ``bad_report`` error and no figures."""
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise DeviceError(f"{device}: the runner printed no JSON report.", hint="Run it by hand with --debug.")
    environment = doc.get("environment") or {}
    if not isinstance(environment, dict):
        environment = {}
    reports = []
    for item in doc.get("reports") or []:
        if not isinstance(item, dict):
            continue
        problem = invalid_figure(item, runs=runs, warmup=warmup)
        if problem:
            item = {"artifact": item.get("artifact"), "runtime": item.get("runtime"), "threads": item.get("threads"),
                    "error": bad_report(str(item.get("artifact")), problem)}
        runtime = item.get("runtime") or {}
        placement = item.get("placement")
        reports.append(
            CheckReport(
                device=device,
                artifact=str(item.get("artifact")),
                runtime={k: v for k, v in runtime.items()} if isinstance(runtime, dict) else {},
                threads=item.get("threads"),
                load_ms=item.get("load_ms"),
                first_inference_ms=item.get("first_inference_ms"),
                latency_ms=latency_stats(item.get("latency_ms")),
                runs=int(item.get("runs") or 0),
                warmup=int(item.get("warmup") or 0),
                peak_rss_mb=item.get("peak_rss_mb"),
                outputs_match=item.get("outputs_match"),
                environment=environment,
                gates=GateResult(True),
                error=item.get("error"),
                throttled=throttled(environment),
                latency_samples_ms=latency_samples(item.get("latency_samples_ms")),
                placement=placement if isinstance(placement, dict) else None,
                **{key: item.get(key) if isinstance(item.get(key), dict) else None
                   for key in ("profile", "throughput", "loads", "bundled_check", "worker")},
            )
        )
    top_error = doc.get("error")
    if top_error:
        seen = {r.artifact for r in reports}
        for artifact in artifacts:
            if artifact not in seen:
                reports.append(
                    CheckReport(
                        device=device, artifact=artifact, runtime={"name": None, "version": None}, threads=None,
                        load_ms=None, first_inference_ms=None, latency_ms=None, runs=0, warmup=0,
                        peak_rss_mb=None, outputs_match=None, environment=environment, gates=GateResult(True),
                        error=top_error,
                    )
                )
    if not reports:
        raise DeviceError(f"{device}: the runner reported no artifacts.", hint="Is the bundle empty?")
    return reports
