"""The router's metrics added up over its worker processes (`tiergate router --workers N`).

Counters and histograms use prometheus_client's multiprocess mode: each worker writes its
values to files in one folder (PROMETHEUS_MULTIPROC_DIR, set before prometheus_client is
imported) and the worker a scrape lands on reads them all. What the router reads from live
state when scraped (its collectors: connections, endpoints, the ledger, reloads, GC pauses)
another process cannot read, so each worker copies its own into that folder every
SYNC_INTERVAL_S and before it answers a scrape: counters by what they grew, gauges as they are,
combined over the workers as GAUGE_MODES says.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from tiergate.router.base.background import LoopService
from tiergate.router.http.gc_pauses import BUCKETS_S, GcPauses
from tiergate.router.http.gc_pauses import HELP as GC_HELP

__all__ = ["DEFAULT_GAUGE_MODE", "GAUGE_MODES", "SYNC_INTERVAL_S", "SharedMetrics"]

log = logging.getLogger("tiergate.router")

GaugeMode = Literal["livesum", "livemax", "liveall"]

#: Seconds between copies of a worker's live values; a scrape sees the answering worker's
#: own values as they are and the others' as of their last copy.
SYNC_INTERVAL_S = 1.0

#: How each gauge read at scrape time combines over the live workers. A dead worker's gauges
#: are dropped (the supervisor marks it dead); its counters stay counted.
GAUGE_MODES: dict[str, GaugeMode] = {
    # Each worker's own: the pod's total.
    "tiergate_inflight_requests": "livesum",
    "tiergate_pool_waiting_requests": "livesum",
    "tiergate_connections_open": "livesum",
    "tiergate_connections_max": "livesum",
    "tiergate_ledger_backlog_records": "livesum",
    "tiergate_fair_share_fleet": "livesum",
    "tiergate_fair_share_slots": "livesum",
    # One fact each worker reads on its own (the endpoints' queues, the ledger's size), or
    # each worker's own view of shared state (ejections, spent check budgets): the most any
    # worker sees.
    "tiergate_queue_depth": "livemax",
    "tiergate_ledger_wal_bytes": "livemax",
    "tiergate_ledger_used_bytes": "livemax",
    "tiergate_endpoints": "livemax",
    "tiergate_pool_endpoints": "livemax",
    "tiergate_tenant_budget_usd": "livemax",
    "tiergate_tenant_budget_spent_usd": "livemax",
    "tiergate_cascade_check_budget_spent_tenants": "livemax",
    "tiergate_discovery_failing_seconds": "livemax",
}
#: A gauge not listed: each worker's value, with a `pid` label.
DEFAULT_GAUGE_MODE: GaugeMode = "liveall"


class SharedMetrics(LoopService):
    """One worker's part of the shared metrics: copies what `collectors` and `gc_pauses`
    read into the shared folder while the app runs (a service), and exports every worker's
    metrics added up."""

    task_name = "shared-metrics"

    def __init__(
        self,
        path: Path,
        collectors: Sequence[Collector],
        gc_pauses: GcPauses,
        *,
        restarted: bool = False,
        interval_s: float = SYNC_INTERVAL_S,
    ) -> None:
        if not getattr(prometheus_values.ValueClass, "_multiprocess", False):
            raise RuntimeError(
                "prometheus_client is not in multiprocess mode: PROMETHEUS_MULTIPROC_DIR must "
                "be set before it is imported"
            )
        self.path = path
        self._collectors = list(collectors)
        self._gc_pauses = gc_pauses
        self._interval_s = interval_s
        self._gauges: dict[str, Gauge] = {}
        self._gauge_series: dict[str, set[tuple[str, ...]]] = {}
        self._counters: dict[str, Counter] = {}
        self._counted: dict[tuple[str, tuple[str, ...]], float] = {}
        self._gc = Histogram(
            "tiergate_gc_pause_seconds", GC_HELP, ["generation"], buckets=BUCKETS_S, registry=None
        )
        self._gc_copied = [[(0, 0.0)] * (len(BUCKETS_S) + 1) for _ in gc_pauses.totals()]
        workers = Gauge(
            "tiergate_workers",
            "Worker processes serving (tiergate router --workers).",
            multiprocess_mode="livesum",
            registry=None,
        )
        workers.set(1)
        restarts = Counter(
            "tiergate_worker_restarts",
            "Worker processes started again after one exited unexpectedly.",
            registry=None,
        )
        if restarted:
            restarts.inc()

    def exposition(self) -> bytes:
        """Every worker's metrics, added up (this worker's live values copied first)."""
        self.sync()
        registry = CollectorRegistry()
        MultiProcessCollector(registry, str(self.path))  # type: ignore[no-untyped-call]
        return generate_latest(registry)

    def start(self) -> None:
        self.sync()
        super().start()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self.sync()
            except Exception:  # a bug: the last copy stays, and serving goes on
                log.exception("event=shared_metrics_copy_failed")

    def sync(self) -> None:
        """Copy this worker's live values into the shared folder."""
        for collector in self._collectors:
            for family in collector.collect():
                if family.type == "gauge":
                    self._copy_gauge(family)
                elif family.type == "counter":
                    self._copy_counter(family)
                else:
                    raise TypeError(
                        f"{family.name}: a {family.type} read when scraped cannot be added up "
                        "over worker processes"
                    )
        self._copy_gc_pauses()

    def _copy_gauge(self, family: Metric) -> None:
        seen: set[tuple[str, ...]] = set()
        for sample in family.samples:
            gauge = self._gauges.get(family.name)
            if gauge is None:
                gauge = self._gauges[family.name] = Gauge(
                    family.name,
                    family.documentation,
                    list(sample.labels),
                    multiprocess_mode=GAUGE_MODES.get(family.name, DEFAULT_GAUGE_MODE),
                    registry=None,
                )
            labels = tuple(sample.labels.values())
            (gauge.labels(*labels) if labels else gauge).set(sample.value)
            seen.add(labels)
        # A series gone from this worker (a pool removed) reads 0: a multiprocess metric's
        # series cannot be removed.
        before = self._gauge_series.get(family.name, set())
        for labels in before - seen:
            self._gauges[family.name].labels(*labels).set(0)
        self._gauge_series[family.name] = before | seen

    def _copy_counter(self, family: Metric) -> None:
        for sample in family.samples:
            if sample.name != family.name + "_total":
                continue  # _created: multiprocess mode has none
            counter = self._counters.get(family.name)
            if counter is None:
                counter = self._counters[family.name] = Counter(
                    family.name, family.documentation, list(sample.labels), registry=None
                )
            labels = tuple(sample.labels.values())
            key = (family.name, labels)
            grown = sample.value - self._counted.get(key, 0.0)
            self._counted[key] = sample.value
            child = counter.labels(*labels) if labels else counter  # a series, even at 0
            if grown > 0:
                child.inc(grown)

    def _copy_gc_pauses(self) -> None:
        for generation, buckets in enumerate(self._gc_pauses.totals()):
            child = self._gc.labels(str(generation))
            copied = self._gc_copied[generation]
            for index, (count, total_s) in enumerate(buckets):
                new = count - copied[index][0]
                if new <= 0:
                    continue
                # The pauses of one bucket have their mean in that bucket: observed once for
                # each of them, it adds the same count to the bucket and the same sum.
                low = BUCKETS_S[index - 1] if index else -math.inf
                high = BUCKETS_S[index] if index < len(BUCKETS_S) else math.inf
                mean = (total_s - copied[index][1]) / new
                mean = min(max(mean, math.nextafter(low, math.inf)), high)
                for _ in range(new):
                    child.observe(mean)
                copied[index] = (count, total_s)
