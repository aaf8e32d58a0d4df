"""The collector's pauses, as the router exposes them."""

from __future__ import annotations

import gc
import re

from prometheus_client import CollectorRegistry, generate_latest

from tiergate.router.http.gc_pauses import GcPauses


def exposition(pauses: GcPauses) -> str:
    registry = CollectorRegistry()
    registry.register(pauses)
    return generate_latest(registry).decode()


def sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    assert match is not None, f"{name}{{{want}}} not in:\n{text}"
    return float(match.group(1))


def test_each_pause_lands_in_its_bucket_and_generation() -> None:
    now = [0.0]
    pauses = GcPauses(clock=lambda: now[0])
    for generation, seconds in [(0, 0.00005), (1, 0.0015), (2, 0.015), (2, 0.3)]:
        pauses._observe("start", {"generation": generation})
        now[0] += seconds
        pauses._observe("stop", {"generation": generation})
    text = exposition(pauses)
    name = "tiergate_gc_pause_seconds"
    assert sample(text, name + "_bucket", generation="0", le="0.0001") == 1
    assert sample(text, name + "_bucket", generation="1", le="0.001") == 0
    assert sample(text, name + "_bucket", generation="1", le="0.002") == 1
    assert sample(text, name + "_bucket", generation="2", le="0.02") == 1
    assert sample(text, name + "_bucket", generation="2", le="0.25") == 1  # 0.3 s is above it
    assert sample(text, name + "_bucket", generation="2", le="+Inf") == 2
    assert sample(text, name + "_count", generation="2") == 2
    assert abs(sample(text, name + "_sum", generation="2") - 0.315) < 1e-9


def test_installed_it_times_real_collections_and_uninstalled_it_stops() -> None:
    pauses = GcPauses()
    pauses.install()
    pauses.install()  # once only
    try:
        assert gc.callbacks.count(pauses._observe) == 1
        gc.collect()
    finally:
        pauses.uninstall()
    assert pauses._observe not in gc.callbacks
    text = exposition(pauses)
    assert sample(text, "tiergate_gc_pause_seconds_count", generation="2") >= 1
    assert sample(text, "tiergate_gc_pause_seconds_sum", generation="2") > 0
    gc.collect()
    assert exposition(pauses) == text  # nothing timed after uninstall
