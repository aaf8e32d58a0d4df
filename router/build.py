"""Assembling a router from its configuration: one place that wires the stages together."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from tiergate.common.connection_limits import ConnectionGate
from tiergate.router.admission import Saturation
from tiergate.router.config import RouterConfig, load_config
from tiergate.router.discovery.kube import KubeSource
from tiergate.router.discovery.outliers import OutlierDetector
from tiergate.router.discovery.scraper import MetricsFetcher, Scraper
from tiergate.router.discovery.view import FileSource, PoolSource, PoolView
from tiergate.router.endpoints.state import EndpointState
from tiergate.router.fleet_share import FleetShare
from tiergate.router.handler import Router
from tiergate.router.http.app import RouterApp, Service
from tiergate.router.http.metrics import RouterMetrics
from tiergate.router.ledger.backlog import LedgerBacklogWriter
from tiergate.router.ledger.postgres import PostgresLedger, where
from tiergate.router.ledger.records import LedgerError
from tiergate.router.ledger.retention import LedgerRetention
from tiergate.router.ledger.spool import LedgerSpool, spool_folder
from tiergate.router.ledger.sqlite import Ledger
from tiergate.router.ledger.store import LedgerStore
from tiergate.router.policy import PolicyConfig
from tiergate.router.request.tool_check import ToolCallChecker
from tiergate.router.tenants.budgets import BudgetGuard
from tiergate.router.tenants.fleet_budgets import FleetBudgets
from tiergate.router.tenants.fleet_ratelimit import FleetRateLimiter
from tiergate.router.tenants.guards import Budgets, Limits
from tiergate.router.tenants.ratelimit import RateLimiter
from tiergate.router.tenants.registry import TenantRegistry, load_tenants
from tiergate.router.tenants.reload import TenantsReloader
from tiergate.router.upstream.proxy import Upstream
from tiergate.sim_nodes.catalogs import Catalog, default_catalog

log = logging.getLogger("tiergate.router")


def build_app(
    config: RouterConfig,
    source: PoolSource,
    *,
    clock: Callable[[], float] = time.monotonic,
    extra_services: list[Service] | None = None,
    max_connections: int | None = None,
) -> RouterApp:
    """The router app for `config`, reading pools from `source`. `max_connections`: the
    connection cap the open-file limit allows (router/cli/serve.py), if known.

    Raises TenantConfigError / LedgerError when the tenants file or the ledger is unusable.
    """
    settings = config.router
    if settings.tenants_file is not None:
        tenants = load_tenants(settings.tenants_file)
    dsn = settings.ledger_dsn()
    ledger: LedgerStore
    if dsn is not None:
        folder = spool_folder(settings.ledger_spool_dir, where(dsn))
        spool = LedgerSpool(folder, int(settings.ledger_spool_max_size))
        ledger = PostgresLedger(dsn, spool=spool)
    else:
        ledger = _sqlite_ledger(settings.ledger_path)
    if settings.tenants_file is None:  # after what may fail: its warning is no error's preface
        tenants = TenantRegistry.open()
    retention = LedgerRetention(
        ledger,
        max_age_days=settings.ledger_retention_days,
        max_bytes=settings.ledger_max_size,
    )

    def view() -> PoolView:
        return source.view

    def policy() -> PolicyConfig:
        # A file's policy is applied when the file is reloaded; other sources keep the first.
        return source.config.router.policy if isinstance(source, FileSource) else settings.policy

    log.info("event=routing_policy %s", settings.policy.summary())

    def pool_members(pool: str) -> list[EndpointState]:
        routed = source.view.pools.get(pool)
        return list(routed.endpoints) if routed is not None else []

    outliers = OutlierDetector(pool_members=pool_members)
    upstream = Upstream(
        attempts=settings.upstream_attempts,
        read_timeout_s=settings.upstream_read_timeout_s,
        whole_reply_timeout_s=settings.whole_reply_timeout_s,
        max_reply_bytes=settings.max_reply_bytes,
        on_success=outliers.record_success,
        on_failure=lambda e: outliers.record_failure(e, clock()),
        clock=clock,
    )
    # The scraper has a client of its own: scraping hundreds of endpoints must not take
    # connections from (or add connections to) the proxy's pool.
    fetcher = MetricsFetcher(max_connections=32)
    # Tier saturation is worked out from the endpoints' waiting counts once per scrape round
    # (they change only then), not per request.
    saturation = Saturation()
    scraper = Scraper(
        # A hosted pool's provider has no vLLM metrics: its health is its replies.
        lambda: [e for e in source.view.endpoints() if e.hosted is None],
        fetcher,
        clock=clock,
        interval_s=settings.scrape_interval_s,
        max_concurrency=32,
        on_round=lambda _: saturation.refresh(source.view),
    )
    metrics = RouterMetrics(view, clock, ledger, retention)
    connections = ConnectionGate(settings.connections.limits(max_connections), log)
    metrics.count_connections(connections)
    tool_checker = ToolCallChecker(
        on_unchecked=lambda reason: metrics.cascade_unchecked.labels(reason).inc()
    )
    metrics.count_check_budgets(tool_checker.tenants_over_budget)
    budgets: Budgets
    limiter: Limits
    shared: list[Service] = []
    if isinstance(ledger, PostgresLedger):
        budgets, limiter = FleetBudgets(ledger), FleetRateLimiter(ledger, clock)
        shared = [ledger, budgets, limiter]  # the ledger stops after its users
    else:
        assert isinstance(ledger, Ledger)
        budgets = BudgetGuard(ledger, tenants=tenants.tenants.values())
        limiter = RateLimiter(clock)
        shared = [LedgerBacklogWriter(ledger)]
    router = Router(
        view=view,
        tenants=tenants,
        limiter=limiter,
        budgets=budgets,
        ledger=ledger,
        upstream=upstream,
        metrics=metrics,
        settings=settings,
        policy=policy,
        clock=clock,
        saturation=saturation,
        tool_checker=tool_checker,
    )
    # A new view resizes the tier queues at once: waiters take new endpoints' slots.
    source.on_view = router.pipeline
    # Fair share across the fleet: only with a shared ledger, and only for fair admission.
    interval_s = settings.fleet_fair_share_interval_s
    fair = settings.admission_order == "fair"
    if isinstance(ledger, PostgresLedger) and interval_s is not None and fair:
        fleet_share = FleetShare(ledger, lambda: router.admission.queues, period_s=interval_s)
        shared.append(fleet_share)  # stops before the ledger: it withdraws its claims
        metrics.count_fair_share(fleet_share)
    metrics.count_pool_waiting(view, router.admission.waiting)
    # Read through `router`: a reload swaps its tenants.
    metrics.count_budgets(
        lambda: router.tenants.tenants.values(), lambda: router.budgets, lambda: router.wall()
    )
    # The source first: services stop in reverse order, so discovery stops last.
    services: list[Service] = [
        source,
        _Closing(fetcher),
        scraper,
        *shared,
        retention,
        tool_checker,
        *(extra_services or []),
    ]
    if settings.tenants_file is not None:
        reloader = TenantsReloader(
            settings.tenants_file,
            router.swap_tenants,
            interval_s=lambda: settings.reload_interval_s,
        )
        services.append(reloader)
        metrics.count_reloads(
            "tenants", lambda: (reloader.file.reloads, reloader.file.reload_errors)
        )
    if isinstance(source, FileSource):
        file = source
        metrics.count_reloads("pools", lambda: (file.file.reloads, file.file.reload_errors))
    if isinstance(source, KubeSource):
        metrics.count_discovery(source.watchers)
    app = RouterApp(
        router,
        services,
        synced=lambda: source.synced,
        ready_needs_endpoints=source.ready_needs_endpoints,
        connections=connections,
        metrics=metrics,
        shutdown_grace_s=settings.shutdown_grace_s,
    )
    if settings.epp_port is not None:
        # Imported here: gRPC and Envoy's generated messages load only where the picker runs.
        from tiergate.router.epp.server import EppServer

        app.services.append(  # started last, stopped first: no stream outlives the router
            EppServer(
                router,
                settings.host,
                settings.epp_port,
                fallbacks=settings.epp_fallbacks,
                tls=settings.epp_tls,
                ready=lambda: app.readiness()[0],
                on_failure=lambda e: outliers.record_failure(e, clock()),
                internal_error=metrics.internal_errors.inc,
                grace_s=settings.shutdown_grace_s,
            )
        )
    return app


def _sqlite_ledger(path: Path) -> Ledger:
    if str(path) != ":memory:":
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"cannot create the usage ledger's folder: {exc}") from None
    return Ledger(path)


class _Closing:
    """Closes a client when the app stops (services stop in reverse order)."""

    def __init__(self, client: MetricsFetcher) -> None:
        self.client = client

    def start(self) -> None:
        return None

    async def stop(self) -> None:
        await self.client.aclose()


def file_source(path: Path, catalog: Catalog | None = None) -> tuple[RouterConfig, FileSource]:
    """The configuration in `path` and a source that hot-reloads its pools."""
    source = FileSource(path, catalog or default_catalog())
    return source.config, source


def router_source(path: Path, catalog: Catalog | None = None) -> tuple[RouterConfig, PoolSource]:
    """The configuration in `path` and the pool source it asks for.

    With `discovery.kubernetes`, InferencePools and their pods (the file is read once);
    otherwise the file's own pools, hot-reloaded. Raises ConfigError.
    """
    config = load_config(path)
    if config.discovery.kubernetes is None:
        return file_source(path, catalog)
    return config, kube_source(config, catalog)


def kube_source(config: RouterConfig, catalog: Catalog | None = None) -> KubeSource:
    """A Kubernetes source for `config.discovery.kubernetes` (ConfigError without an API)."""
    # Imported here: the kubernetes client is a heavy import only this source needs.
    from tiergate.router.discovery.kube_client import (
        KubernetesApi,
        load_api_client,
        resolve_namespace,
    )

    settings = config.discovery.kubernetes
    if settings is None:
        raise ValueError("kube_source needs discovery.kubernetes")
    namespace = resolve_namespace(settings.namespace)
    api_client, origin = load_api_client()
    log.info("event=kube_api_configured origin=%s namespace=%s", origin, namespace)
    api = KubernetesApi(api_client, namespace)
    return KubeSource(
        api, catalog or default_catalog(), namespace=namespace, read_secret=api.read_secret
    )
