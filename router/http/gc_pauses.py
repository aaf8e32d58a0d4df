"""Garbage-collector pauses as a Prometheus histogram: `tiergate_gc_pause_seconds{generation}`.

Python's cyclic collector stops the event loop while it runs, so its pauses show up in every
request and every relayed chunk of that moment, and a full collection's pause grows with the
live streams (router/cli/serve.py tunes how often one runs). This metric lets an operator tell
a collector-made tail from a slow node.

The callback runs inside the collector, on whichever thread allocated. It only does
arithmetic on plain lists and takes no lock, because a lock held by the interrupted code would
deadlock. The collector turns the counts into a histogram when /metrics is scraped.
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

__all__ = ["BUCKETS_S", "HELP", "GcPauses"]

#: Upper bounds of the histogram's buckets, seconds.
BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25)
GENERATIONS = 3
HELP = "Pauses of Python's cyclic garbage collector in the router process, by generation."


class GcPauses(Collector):
    """Times each collection between `install()` and `uninstall()`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started = 0.0
        self._counts = [[0] * (len(BUCKETS_S) + 1) for _ in range(GENERATIONS)]
        self._sums = [0.0] * GENERATIONS
        # Each bucket's own sum too: what worker processes need to add their pauses up
        # (router/http/shared_metrics.py).
        self._bucket_sums = [[0.0] * (len(BUCKETS_S) + 1) for _ in range(GENERATIONS)]

    def install(self) -> None:
        if self._observe not in gc.callbacks:
            gc.callbacks.append(self._observe)

    def uninstall(self) -> None:
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        pause = self._clock() - self._started
        generation = info["generation"]
        bucket = bisect_left(BUCKETS_S, pause)
        self._counts[generation][bucket] += 1
        self._sums[generation] += pause
        self._bucket_sums[generation][bucket] += pause

    def totals(self) -> list[list[tuple[int, float]]]:
        """Per generation, per bucket (the last: above BUCKETS_S[-1]): the pauses counted in
        it and their sum, seconds, since the app started."""
        # Copied with the collector off, so that no pause is counted between a bucket's count
        # and its sum.
        enabled = gc.isenabled()
        gc.disable()
        try:
            counts = [row[:] for row in self._counts]
            sums = [row[:] for row in self._bucket_sums]
        finally:
            if enabled:
                gc.enable()
        return [list(zip(c, s, strict=True)) for c, s in zip(counts, sums, strict=True)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily("tiergate_gc_pause_seconds", HELP, labels=["generation"])
        for generation in range(GENERATIONS):
            cumulative = list(accumulate(self._counts[generation]))
            buckets = [(str(b), float(c)) for b, c in zip(BUCKETS_S, cumulative, strict=False)]
            buckets.append(("+Inf", float(cumulative[-1])))
            family.add_metric([str(generation)], buckets, sum_value=self._sums[generation])
        yield family
