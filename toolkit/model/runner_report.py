"""The device runner's JSON report read into ungated :class:`CheckReport` records, and what in it says the device
throttled. One reader for every place reports arrive: a check over SSH and the report files a device left
(the Mender update module's, ``edgetk history import``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from toolkit.errors import DeviceError
from toolkit.model.device_records import CheckReport, GateResult, LatencyStats
from toolkit.model.records import JsonObject

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


def parse_runner_output(stdout: str, *, device: str, artifacts: Sequence[str]) -> list[CheckReport]:
    """The runner's JSON -> ungated CheckReports (a top-level error becomes one failed report per artifact)."""
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise DeviceError(f"{device}: the runner printed no JSON report.", hint="Run it by hand with --debug.")
    environment = doc.get("environment") or {}
    reports = []
    for item in doc.get("reports") or []:
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
