"""The requests waiting in the router's tier queues, per pool, on /metrics: the operator's
autoscaler scrapes them from every router pod and counts them in each pool's demand
(router/pool_demand.py says how a tier's waiting requests are attributed to its pools)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tiergate.router.base.tiers import Tier
from tiergate.router.discovery.view import PoolView
from tiergate.router.pool_demand import waiting_per_pool

__all__ = ["POOL_WAITING", "PoolWaitingCollector"]

POOL_WAITING = "tiergate_pool_waiting_requests"


class PoolWaitingCollector(Collector):
    """`tiergate_pool_waiting_requests{pool, tier}` for every pool of the view, zeros
    included (a pool not listed is one this router does not know)."""

    def __init__(
        self,
        view: Callable[[], PoolView],
        waiting: Callable[[], Mapping[tuple[Tier, str], int]],
    ) -> None:
        self._view, self._waiting = view, waiting

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            POOL_WAITING,
            "Requests waiting in this router's queue for each pool's tier and model, shared "
            "among the pools serving them by the slots each offers (the operator's "
            "autoscaler counts them in the pool's demand).",
            labels=["pool", "tier"],
        )
        view = self._view()
        for name, waiting in waiting_per_pool(view, self._waiting()).items():
            family.add_metric([name, view.pools[name].spec.tier], waiting)
        yield family
