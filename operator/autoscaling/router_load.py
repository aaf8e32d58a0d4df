"""The requests waiting at the routers for a pool: each router pod's `/metrics` text in, the
pool's share of its queue out, and what the tick knows of all the routers together. Pure (the
scrape itself is the handler's).

A router admits at most a batch per pod and queues the rest, so the pods alone never show a
load step above that; the routers' `tiergate_pool_waiting_requests` (their queue, attributed
to the pools that will serve it) completes the demand. A router whose queue could not be read
leaves the demand unknown from below: the decision may still scale up on what it knows, never
down (decide.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from .decide import RouterQueues
from .load import MetricsError

__all__ = ["POOL_WAITING", "RouterQueues", "parse_router_waiting", "router_queues"]

#: The router's gauge of requests waiting in its queue, per pool (router/http/metrics.py).
POOL_WAITING = "tiergate_pool_waiting_requests"


def parse_router_waiting(text: str) -> dict[str, float]:
    """One router pod's `/metrics` (Prometheus text) read: pool name -> requests waiting for
    it. A pool the router does not list has none waiting there. Raises MetricsError when the
    text is not a router's or a value is negative or not finite (nothing of it is used)."""
    found: dict[str, float] = {}
    seen = False
    try:
        for family in text_string_to_metric_families(text):
            if family.name != POOL_WAITING:
                continue
            seen = True
            for sample in family.samples:
                pool, value = sample.labels.get("pool"), sample.value
                if not pool:
                    raise MetricsError(f"{POOL_WAITING} without a pool label")
                if not math.isfinite(value) or value < 0:
                    raise MetricsError(f"{POOL_WAITING}{{pool={pool!r}}} is {value}")
                found[pool] = found.get(pool, 0.0) + value
    except ValueError as exc:  # the parser's word for text it cannot read (MetricsError too)
        if isinstance(exc, MetricsError):
            raise
        raise MetricsError(f"unreadable metrics: {exc}") from None
    if not seen:
        raise MetricsError(f"not a router's metrics: no {POOL_WAITING}")
    return found


def router_queues(pool: str, reports: Iterable[dict[str, float] | None]) -> RouterQueues:
    """The queues of `pool` over every router pod's report (None: that pod was not read)."""
    read = [r for r in reports]
    answered = [r for r in read if r is not None]
    waiting = sum(r.get(pool, 0.0) for r in answered)
    return RouterQueues(len(read), round(waiting), unread=len(read) - len(answered))
