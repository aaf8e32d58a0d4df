"""Fair share across the fleet on /metrics: how this process's exchanges go and what part of
each tier it fills (router/fleet_share.py), read when scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tiergate.router.fleet_share import FleetShare

__all__ = ["FairShareCollector"]


class FairShareCollector(Collector):
    """`tiergate_fair_share_exchanges_total{outcome}`, `..._exchange_seconds_total`,
    `tiergate_fair_share_fleet` and `tiergate_fair_share_slots{tier}`."""

    def __init__(self, share: FleetShare) -> None:
        self._share = share

    def collect(self) -> Iterator[Metric]:
        share = self._share
        exchanges = CounterMetricFamily(
            "tiergate_fair_share_exchanges",
            "Exchanges of fair-share claims with the other router processes through the "
            "PostgreSQL ledger, by outcome (ok, failed).",
            labels=["outcome"],
        )
        exchanges.add_metric(["ok"], share.exchanges)
        exchanges.add_metric(["failed"], share.failures)
        yield exchanges
        yield CounterMetricFamily(
            "tiergate_fair_share_exchange_seconds",
            "Time spent in successful fair-share exchanges (over the ok exchanges: the mean "
            "round trip).",
            value=share.exchange_seconds,
        )
        yield GaugeMetricFamily(
            "tiergate_fair_share_fleet",
            "Router processes filling only their part of each tier, as the fleet allotted it "
            "(0 while the database cannot be reached: each fills the whole tier on its own).",
            value=1.0 if share.shared else 0.0,
        )
        slots = GaugeMetricFamily(
            "tiergate_fair_share_slots",
            "Slots of a tier the fleet allotted this router process (headroom aside); only "
            "while tiergate_fair_share_fleet is 1.",
            labels=["tier"],
        )
        for tier, allotted in share.allotted().items():
            slots.add_metric([tier], allotted)
        yield slots
