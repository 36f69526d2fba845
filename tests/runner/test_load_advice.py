"""The rule that turns the runner's ``--loads`` rounds into suggestions (toolkit.reporting.load_advice): an
option is suggested only where every round with it beat every round without it, by at least 10%. The reports
here are written by hand in the runner's shape, to pin the rule's edges; the runner's real reports are checked
on the device env in test_inside.py."""

from __future__ import annotations

from typing import Any


def _side(load: tuple[float, float, float], rss: tuple[float, float, float]) -> dict[str, Any]:
    return {"rounds": 3, "load_ms": load[1], "load_ms_range": [load[0], load[2]],
            "peak_rss_mb": rss[1], "peak_rss_mb_range": [rss[0], rss[2]]}


def test_only_gains_beyond_every_round_are_suggested() -> None:
    from toolkit.reporting.load_advice import paying_options
    from toolkit.reporting.terminal import loads_lines

    before = _side((90.0, 100.0, 110.0), (100.0, 101.0, 102.0))
    loads = {"cold": {}, "warm": {}, "options": [
        {"name": "faster", "before": before, "after": _side((60.0, 70.0, 80.0), (100.0, 101.0, 102.0))},
        {"name": "overlapping", "before": before, "after": _side((50.0, 60.0, 95.0), (100.0, 101.0, 102.0))},
        {"name": "too-small", "before": _side((95.0, 96.0, 97.0), (100.0, 101.0, 102.0)),
         "after": _side((88.0, 90.0, 91.0), (100.0, 101.0, 102.0))},  # beats every round, but by 6%
        {"name": "leaner", "before": before, "after": _side((95.0, 100.0, 105.0), (80.0, 81.0, 82.0))},
        {"name": "once", "before": {"load_ms": 100.0}, "after": {"load_ms": 10.0}},
        {"name": "broken", "before": before, "after": {"error": {"message": "no"}}},
    ]}
    advice = paying_options(loads)
    assert [(a.option, a.metric) for a in advice] == [("faster", "load"), ("leaner", "peak RSS")]
    assert advice[0].before == 100.0 and advice[0].after == 70.0 and round(advice[0].ratio, 2) == 0.7
    assert any(line.strip().startswith("pays here: faster: load 100.0 -> 70.0 ms") for line in loads_lines(loads))
    none = {"cold": {}, "warm": {}, "options": [loads["options"][1]]}
    assert paying_options(none) == ()
    assert any("no ONNX Runtime session option paid" in line for line in loads_lines(none))
