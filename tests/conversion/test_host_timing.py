"""Host timings decide only for a profile that is this host, and then only by a paired statistical test.

The unit half feeds hand-made samples to the judge (a load that shifts both sides alike, a real 5x slowdown);
the conversion half builds a generic-x86_64 bundle whose INT8 is made really slower (each INT8 inference
also sleeps 5 ms, inside the paired rounds) and checks it ships ``slower`` and not preferred, while fp32 is
preferred. Everything else in that conversion is real.
"""

from __future__ import annotations

import platform
import random
import time

import pytest

from toolkit.conversion import host_timing
from toolkit.conversion.host_timing import Speed, judge


def test_a_difference_inside_the_noise_is_no_speedup_not_slower() -> None:
    fp32 = [1.0 + 0.02 * (i % 18) for i in range(36)]
    candidate = [v + 0.04 for v in fp32]  # 3% apart: a rank test may see it, the minimum effect does not
    verdict = judge(candidate, fp32)
    assert verdict.speed is Speed.NO_SPEEDUP
    assert "no speedup measured" in verdict.describe("onnxruntime")


def test_a_load_that_hits_both_sides_does_not_flip_the_verdict() -> None:
    """Half the rounds run under a hog that doubles every time: paired, both sides pay it alike."""
    rng = random.Random(3)
    fp32, candidate = [], []
    for round_ in range(12):
        load = 2.0 if round_ % 4 in (1, 2) else 1.0
        fp32 += [load * (1.0 + rng.random() * 0.05) for _ in range(3)]
        candidate += [load * (0.7 + rng.random() * 0.05) for _ in range(3)]
    assert judge(candidate, fp32).speed is Speed.FASTER
    assert judge(fp32, candidate).speed is Speed.SLOWER


def test_clear_effects_are_judged_both_ways() -> None:
    fp32 = [1.0 + 0.01 * i for i in range(30)]
    slow = [5.0 + 0.01 * i for i in range(30)]
    assert judge(slow, fp32).speed is Speed.SLOWER
    assert judge(fp32, slow).speed is Speed.FASTER
    assert "slower than fp32" in judge(slow, fp32).describe("litert")


def test_only_the_profile_of_this_machine_is_this_host() -> None:
    assert host_timing.is_this_host("local")
    assert not host_timing.is_this_host("raspberry-pi-4")
    assert not host_timing.is_this_host("jetson-orin-nano")
    if platform.machine() in ("x86_64", "AMD64"):
        assert host_timing.is_this_host("generic-x86_64")
        assert not host_timing.is_this_host("generic-aarch64")
    assert host_timing.host_cpu()  # the label every host latency carries


@pytest.mark.timing
def test_a_really_slower_int8_on_the_host_profile_is_slower(digits_keras, digits_calibration, tmp_path,
                                                             monkeypatch) -> None:
    from toolkit.model.options import ConvertOptions
    from toolkit.conversion.pipeline import convert_bundle

    real = host_timing.paired

    def slowed(candidate, fp32, feed, **kw):  # the INT8 side sleeps 5 ms per inference: really slower
        def slow(values):
            time.sleep(0.005)
            return candidate(values)

        return real(slow, fp32, feed, **kw)

    monkeypatch.setattr(host_timing, "paired", slowed)
    monkeypatch.setattr(host_timing, "is_this_host", lambda name: name == "generic-x86_64")
    from toolkit.conversion import candidate as candidate_module

    monkeypatch.setattr(candidate_module, "is_this_host", host_timing.is_this_host)
    from tests.fixtures.verification_child import runs_in_this_process

    runs_in_this_process(monkeypatch)  # the slowed INT8 is this process's
    result = convert_bundle(
        ConvertOptions(source=str(digits_keras), calibration=digits_calibration, formats=("tflite",),
                       target="generic-x86_64", out=tmp_path / "b", use_cache=False),
        progress=lambda m: None,
    )
    int8 = result.manifest.artifact("model.int8.tflite")
    assert int8.status == "slower" and not int8.preferred
    assert result.manifest.artifact("model.fp32.tflite").preferred
    assert int8.host_latency_ms is not None and int8.host_latency_ms > 5.0
    assert any("paired over" in note for note in int8.notes)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
