"""The router's Prometheus metrics, on a registry of its own (one per app, so tests can make
many). Queue depth and endpoint health are read from the live pool view at scrape time.

A worker of `tiergate router --workers N` exports the metrics of all of them added up
(`share`, router/http/shared_metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tiergate.common.connection_limits import ConnectionGate
from tiergate.common.tiers import Priority
from tiergate.router.base.tiers import TIERS, Tier
from tiergate.router.discovery.view import PoolView
from tiergate.router.fleet_share import FleetShare
from tiergate.router.http.budget_metrics import BudgetCollector
from tiergate.router.http.fair_share_metrics import FairShareCollector
from tiergate.router.http.gc_pauses import GcPauses
from tiergate.router.http.pool_demand_metrics import PoolWaitingCollector
from tiergate.router.http.shared_metrics import SharedMetrics
from tiergate.router.ledger.postgres import PostgresLedger
from tiergate.router.ledger.records import LedgerError
from tiergate.router.ledger.retention import LedgerRetention
from tiergate.router.ledger.sqlite import Ledger
from tiergate.router.ledger.store import LedgerStore
from tiergate.router.request.spill import SpillReason
from tiergate.router.tenants.guards import Budgets
from tiergate.router.tenants.registry import Tenant

if TYPE_CHECKING:  # the watches are imported only where Kubernetes is watched
    from tiergate.router.discovery.kube_watch import ResourceWatcher

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.5, 1)


class RouterMetrics:
    def __init__(
        self,
        view: Callable[[], PoolView],
        now: Callable[[], float],
        ledger: LedgerStore,
        retention: LedgerRetention,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tiergate_requests",
            "Completion requests by tier requested, tier served and outcome.",
            ["tier_requested", "tier_served", "outcome"],
            registry=r,
        )
        self.ttft = Histogram(
            "tiergate_time_to_first_token_seconds",
            "Time to first token seen by clients.",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "tiergate_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            ["tier"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.cost = Counter(
            "tiergate_cost_usd",
            "Cost billed, USD, at the served tier's price.",
            ["tier"],
            registry=r,
        )
        self.tokens = Counter("tiergate_tokens", "Tokens served.", ["tier", "kind"], registry=r)
        self.shed = Counter(
            "tiergate_shed", "Requests shed by admission control.", ["tier", "priority"], registry=r
        )
        self.admission_wait = Histogram(
            "tiergate_admission_wait_seconds",
            "Time admitted requests waited in their tier's queue at the router, by tenant.",
            ["tier", "tenant"],
            buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.attained = Counter(
            "tiergate_tenant_attained_tokens",
            "Tokens (prompt + output) a tier served each tenant: its attained service.",
            ["tier", "tenant"],
            registry=r,
        )
        self.spills = Counter(
            "tiergate_spills",
            "Requests spilled over from their tier to another, by reason (saturated, slo).",
            ["from_tier", "to_tier", "reason"],
            registry=r,
        )
        # Series that exist before their first event, at zero, so rate() and increase() see
        # that event (Prometheus cannot tell a new series' first increment from its start).
        for tier in TIERS:
            for priority in get_args(Priority):
                self.shed.labels(tier, priority)
            for to_tier in TIERS:
                for reason in get_args(SpillReason):
                    if to_tier != tier:
                        self.spills.labels(tier, to_tier, reason)
        self.retries = Counter(
            "tiergate_upstream_retries", "Upstream attempts beyond the first.", registry=r
        )
        self.midstream_errors = Counter(
            "tiergate_midstream_errors",
            "Streams ended by an upstream failure.",
            ["tier"],
            registry=r,
        )
        self.escalations = Counter(
            "tiergate_cascade_escalations",
            "Cascaded requests re-run on the full-quality tier.",
            ["from_tier", "to_tier"],
            registry=r,
        )
        self.cascade_unchecked = Counter(
            "tiergate_cascade_unchecked",
            "Cascade replies served without their tool-call check: it used its CPU deadline "
            "(timeout), its worker neither answered nor used it in ten times that (stalled), "
            "gave way to another tenant's check after its share of a worker (preempted), waited "
            "too long for the checker (busy), its tenant had spent its budget of check time "
            "(over_budget), it ran out of its memory (out_of_memory), or the checker failed.",
            ["reason"],
            registry=r,
        )
        self.accounting_errors = Counter(
            "tiergate_accounting_errors",
            "Requests whose accounting failed: the ledger refused the record itself (it holds "
            "records while its database refuses writes: tiergate_ledger_backlog_records), or a "
            "bug (logged).",
            registry=r,
        )
        self.ledger_refusals = Counter(
            "tiergate_ledger_refused_requests",
            "Requests refused with 503 ledger_unavailable: the PostgreSQL ledger could not be "
            "written and this process's spool was nearly full (refused before any work), or "
            "could not take the reply's record (its end was not sent).",
            registry=r,
        )
        self.internal_errors = Counter(
            "tiergate_internal_errors", "Requests that hit a router bug (500).", registry=r
        )
        # Collectors that read live state when scraped.
        self._live: list[Collector] = []
        self._read_when_scraped(_LiveCollector(view, now))
        self._read_when_scraped(_LedgerCollector(ledger, retention))
        self._reloads = _ReloadCollector()
        self._read_when_scraped(self._reloads)
        # Timed from the app's start to its stop (RouterApp installs and removes it).
        self.gc_pauses = GcPauses()
        r.register(self.gc_pauses)
        self._shared: SharedMetrics | None = None

    def exposition(self) -> bytes:
        if self._shared is not None:
            return self._shared.exposition()
        return generate_latest(self.registry)

    def share(self, path: Path, *, restarted: bool = False) -> SharedMetrics:
        """Export the metrics of every worker process that shares the folder `path` (this one's
        included), added up; prometheus_client must be in multiprocess mode. The result is a
        service of the app: it copies this worker's live values into `path` while it runs.
        `restarted`: this worker replaces one that exited (`tiergate_worker_restarts_total`)."""
        self._shared = SharedMetrics(path, self._live, self.gc_pauses, restarted=restarted)
        return self._shared

    def _read_when_scraped(self, collector: Collector) -> None:
        self.registry.register(collector)
        self._live.append(collector)

    def count_connections(self, gate: ConnectionGate) -> None:
        """Export the client connections `gate` counts: open, the cap, refused, timed out."""
        self._read_when_scraped(_ConnectionCollector(gate))

    def count_fair_share(self, share: FleetShare) -> None:
        """Export how fair share across the fleet goes (router/fleet_share.py)."""
        self._read_when_scraped(FairShareCollector(share))

    def count_pool_waiting(
        self, view: Callable[[], PoolView], waiting: Callable[[], Mapping[tuple[Tier, str], int]]
    ) -> None:
        """Export the requests waiting in the tier queues (`waiting()`: by tier and model),
        attributed to the pools of `view()` that serve them."""
        self._read_when_scraped(PoolWaitingCollector(view, waiting))

    def count_discovery(self, watchers: Sequence[ResourceWatcher]) -> None:
        """Export how the Kubernetes watches that feed the pool view go."""
        self._read_when_scraped(_DiscoveryCollector(watchers))

    def count_check_budgets(self, spent_tenants: Callable[[], list[str]]) -> None:
        """Export how many tenants have spent their budget of cascade check time now (their
        checks are given up at once; the log names them)."""
        self._read_when_scraped(_CheckBudgetCollector(spent_tenants))

    def count_budgets(
        self,
        tenants: Callable[[], Iterable[Tenant]],
        budgets: Callable[[], Budgets],
        now: Callable[[], float],
    ) -> None:
        """Export each tenant's budget and its spend in the current period (wall-clock
        `now`: budget periods are calendar periods)."""
        self._read_when_scraped(BudgetCollector(tenants, budgets, now))

    def count_reloads(self, config: str, reloads: Callable[[], tuple[int, int]]) -> None:
        """Export `reloads()` (applied, failed) as `tiergate_config_reloads_total{config}`;
        one call per reloaded file (pools, tenants), all in the one metric family."""
        self._reloads.sources[config] = reloads


class _DiscoveryCollector(Collector):
    def __init__(self, watchers: Sequence[ResourceWatcher]) -> None:
        self._watchers = watchers

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        failing = GaugeMetricFamily(
            "tiergate_discovery_failing_seconds",
            "How long the router has failed to list and watch this kind of Kubernetes object "
            "(0 while it can): its pools and endpoints are as they were then.",
            labels=["resource"],
        )
        errors = CounterMetricFamily(
            "tiergate_discovery_errors",
            "Lists and watches of Kubernetes objects that failed (the router retries them).",
            labels=["resource"],
        )
        for watcher in self._watchers:
            failing.add_metric([watcher.resource.plural], watcher.failing_s())
            errors.add_metric([watcher.resource.plural], watcher.errors)
        yield failing
        yield errors


class _ReloadCollector(Collector):
    """One family for every reloadable file (a registry takes each name once)."""

    def __init__(self) -> None:
        self.sources: dict[str, Callable[[], tuple[int, int]]] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "tiergate_config_reloads",
            "Reloads of a configuration file that changed: applied, or failed (the previous "
            "configuration kept; the log says why).",
            labels=["config", "result"],
        )
        for config, reloads in self.sources.items():
            applied, failed = reloads()
            family.add_metric([config, "applied"], applied)
            family.add_metric([config, "failed"], failed)
        yield family


class _CheckBudgetCollector(Collector):
    def __init__(self, spent_tenants: Callable[[], list[str]]) -> None:
        self.spent_tenants = spent_tenants

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "tiergate_cascade_check_budget_spent_tenants",
            "Tenants that have spent their budget of cascade check time: their checks are given "
            'up at once (tiergate_cascade_unchecked_total{reason="over_budget"}) until it '
            "refills.",
            value=len(self.spent_tenants()),
        )


class _ConnectionCollector(Collector):
    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gate = self.gate
        yield GaugeMetricFamily(
            "tiergate_connections_open", "Client connections open.", value=gate.open
        )
        yield GaugeMetricFamily(
            "tiergate_connections_max",
            "Client connections the router keeps open at most (router.connections).",
            value=gate.limits.max_connections,
        )
        yield CounterMetricFamily(
            "tiergate_connections_refused",
            "New client connections answered 503 and closed: the cap was reached.",
            value=gate.refused,
        )
        timeouts = CounterMetricFamily(
            "tiergate_connection_timeouts",
            "Client connections closed because a request's headers or body took too long.",
            labels=["phase"],
        )
        for phase, count in gate.timeouts.items():
            timeouts.add_metric([phase], count)
        yield timeouts


class _LiveCollector(Collector):
    def __init__(self, view: Callable[[], PoolView], now: Callable[[], float]) -> None:
        self._view, self._now = view, now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = GaugeMetricFamily(
            "tiergate_queue_depth",
            "Requests waiting at the endpoints of each tier (their vLLM metrics).",
            labels=["tier"],
        )
        endpoints = GaugeMetricFamily(
            "tiergate_endpoints", "Endpoints by tier and state.", labels=["tier", "state"]
        )
        inflight = GaugeMetricFamily(
            "tiergate_inflight_requests", "Requests the router has open, by tier.", labels=["tier"]
        )
        pool_endpoints = GaugeMetricFamily(
            "tiergate_pool_endpoints",
            "Endpoints of each pool by state: ejected (by outlier detection), unreachable "
            "(its last scrape of /metrics failed) or ready; every state of every pool is "
            "listed, zeros included, so a pool with no ready endpoint shows as 0.",
            labels=["pool", "tier", "state"],
        )
        now = self._now()
        view = self._view()
        for pool in view.pools.values():
            counts = dict.fromkeys(("ready", "ejected", "unreachable"), 0)
            for e in pool.endpoints:
                if e.is_ejected(now):
                    counts["ejected"] += 1
                elif e.scrape_failures:
                    counts["unreachable"] += 1
                else:
                    counts["ready"] += 1
            for state, count in counts.items():
                pool_endpoints.add_metric([pool.spec.name, pool.spec.tier, state], count)
        depth: dict[str, float] = {}
        states: dict[tuple[str, str], int] = {}
        open_: dict[str, int] = {}
        for e in view.endpoints():
            depth[e.tier] = depth.get(e.tier, 0.0) + (e.waiting or 0.0)
            state = "ejected" if e.is_ejected(now) else "ready"
            states[(e.tier, state)] = states.get((e.tier, state), 0) + 1
            open_[e.tier] = open_.get(e.tier, 0) + e.inflight
        for tier, value in depth.items():
            waiting.add_metric([tier], value)
        for (tier, state), count in states.items():
            endpoints.add_metric([tier, state], count)
        for tier, count in open_.items():
            inflight.add_metric([tier], count)
        yield waiting
        yield endpoints
        yield inflight
        yield pool_endpoints


class _LedgerCollector(Collector):
    def __init__(self, ledger: LedgerStore, retention: LedgerRetention) -> None:
        self._ledger, self._retention = ledger, retention

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if isinstance(self._ledger, Ledger):
            yield from self._sqlite(self._ledger)
        elif isinstance(self._ledger, PostgresLedger):
            yield from self._spool(self._ledger)
        yield CounterMetricFamily(
            "tiergate_ledger_pruned_rows",
            "Request rows deleted by the ledger's retention (daily totals are kept).",
            value=self._retention.pruned_rows,
        )
        yield CounterMetricFamily(
            "tiergate_ledger_prune_failures",
            "Pruning rounds that failed (the ledger keeps growing meanwhile).",
            value=self._retention.failures,
        )
        yield GaugeMetricFamily(
            "tiergate_ledger_backlog_records",
            "Records held in memory because the ledger's database refused writes (locked, "
            "full, read-only, unreachable); written once it takes them. Not durable meanwhile.",
            value=self._ledger.backlog,
        )
        yield CounterMetricFamily(
            "tiergate_ledger_dropped_records",
            "Records lost: the backlog was full, or the database refused the record itself.",
            value=self._ledger.dropped,
        )

    def _spool(self, ledger: PostgresLedger) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield CounterMetricFamily(
            "tiergate_ledger_swept_rows",
            "Rows of streams whose router process died, closed as `interrupted` by this one "
            "once the dead process's lease had expired.",
            value=ledger.swept,
        )
        spool = ledger.spool
        if spool is None:
            return
        yield GaugeMetricFamily(
            "tiergate_ledger_spool_bytes",
            "Bytes in this process's ledger spool file: records the PostgreSQL ledger could "
            "not take yet, durable on the pod's volume (router.ledgerSpoolMaxSize bounds it).",
            value=spool.bytes,
        )
        yield GaugeMetricFamily(
            "tiergate_ledger_spool_only_records",
            "Records the full backlog let go of that are not yet written: on the pod's volume "
            "only, written from the spool once the backlog is.",
            value=ledger.on_disk_only,
        )
        yield CounterMetricFamily(
            "tiergate_ledger_spooled_records",
            "Records written to the spool because the PostgreSQL ledger could not take them.",
            value=spool.spooled,
        )
        yield CounterMetricFamily(
            "tiergate_ledger_spool_refused_records",
            "Records the spool could not take (full, or the disk failed): held in memory only.",
            value=spool.refused,
        )
        yield CounterMetricFamily(
            "tiergate_ledger_replayed_records",
            "Records of spool files written to the PostgreSQL ledger: dead router processes' "
            "files, and this process's records that a full backlog let go of.",
            value=ledger.replayed,
        )

    def _sqlite(self, ledger: Ledger) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "tiergate_ledger_wal_bytes",
            "Size of the usage ledger's write-ahead log file; it should stay near one "
            "checkpoint interval of records (router/ledger/sqlite.py).",
            value=ledger.wal_bytes(),
        )
        try:
            used = ledger.used_bytes()
        except LedgerError:
            pass  # an unreadable ledger fails records loudly; /metrics still answers
        else:
            yield GaugeMetricFamily(
                "tiergate_ledger_used_bytes",
                "Bytes of the usage ledger's database file in use (without the WAL); "
                "router.ledgerMaxSize bounds it.",
                value=used,
            )
