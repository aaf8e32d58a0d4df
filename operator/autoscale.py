"""One autoscaling tick of one InferencePool: scrape its ready pods and the routers' queues,
decide, and say what to write, in which order, and what to tell people. The kopf timer only
performs it.

The routers are read only when the operator is told where they run (`Routers`), and only for
pools of the namespace they route to. A router pod that does not answer, or answers with
metrics that are not a router's, leaves its queue unknown: the tick may scale up on what it
read, never down, and says so (`status.autoscaling.queuesUnknown`, the condition's message,
and one Warning `RouterQueuesUnknown` when it starts).

The status (`status.autoscaling` and the `Autoscaling` condition) is written before the
scale: a crash between the two leaves a status from which the next tick decides the same,
so nothing flaps. Events: Normal when replicas change; Warning when the autoscaler cannot act
for a reason the condition did not already say (not every tick). `NoMetrics` gets no event:
a pool whose pods are still starting says so in the condition alone.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx
from pydantic import ValidationError

from tiergate.common.addresses import url_host
from tiergate.pools import AutoscalingStatus, Condition, InferencePoolSpec
from tiergate.sim_nodes.catalogs import Catalog

from .autoscaling import (
    Decision,
    MetricsError,
    RouterQueues,
    decide,
    observed_load,
    observed_shape,
    parse_pod_metrics,
    parse_router_waiting,
    replica_capacity,
    router_queues,
    status_time,
)
from .kube import Cluster, PodAddress, RoutersUnknown
from .render import CONTAINER_PORT
from .status import ConditionValue, conditions

__all__ = ["ROUTER_QUEUES_UNKNOWN", "MetricsScraper", "Routers", "Tick", "autoscale"]

log = logging.getLogger("tiergate.operator")

Manifest = dict[str, Any]
T = TypeVar("T")
EventType = Literal["Normal", "Warning"]

#: A pod that does not answer its scrape within this long is left out of the tick.
SCRAPE_TIMEOUT_S = 2.0
#: Pods of one pool scraped at once.
SCRAPE_CONCURRENCY = 16
#: Reasons the autoscaler cannot act for that get no Warning (said by the condition alone).
QUIET_REASONS = frozenset({"NoMetrics"})
#: The Warning posted when some routers' queues become unknown (not a decision's reason: the
#: autoscaler still acts, upwards only).
ROUTER_QUEUES_UNKNOWN = "RouterQueuesUnknown"


class MetricsScraper:
    """GETs a pod's `/metrics` on `port` (default: the sim node's; tests inject an httpx
    transport)."""

    def __init__(
        self,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
        port: int = CONTAINER_PORT,
    ) -> None:
        self._client = httpx.Client(transport=transport, timeout=timeout_s)
        self.port = port

    def __call__(self, pod: PodAddress) -> str:
        """The metrics text; raises httpx.HTTPError when the pod cannot be read, and
        httpx.InvalidURL when its IP is not an IP address."""
        host = url_host(pod.ip)
        if host is None:
            raise httpx.InvalidURL(f"pod IP {pod.ip!r} is not an IP address")
        reply = self._client.get(f"http://{host}:{self.port}/metrics")
        reply.raise_for_status()
        return reply.text

    def close(self) -> None:
        self._client.close()


Scrape = Callable[[PodAddress], str]


@dataclass(frozen=True)
class Routers:
    """Where the routers run (`selector`, a label selector of their pods in `namespace`), the
    namespace whose InferencePools they route to (`serves`), and how a router pod's metrics
    are read."""

    namespace: str
    selector: str
    serves: str
    scrape: Scrape


@dataclass
class Tick:
    """What one tick decided: the status fields to write first, then the replicas (None:
    leave them), and the events to post as (type, reason, message)."""

    status: Manifest
    replicas: int | None
    decision: Decision
    events: list[tuple[EventType, str, str]] = field(default_factory=list)


def autoscale(
    body: Manifest,
    cluster: Cluster,
    catalog: Catalog,
    scrape: Scrape,
    now: datetime.datetime,
    routers: Routers | None = None,
) -> Tick | None:
    """The tick for `body` at `now` (timezone-aware); None when the pool is not autoscaled
    or its spec is invalid (reconciliation reports that). `routers`: where to read what waits
    for the pool at the routers (None: nowhere, the pods' load alone)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        spec = InferencePoolSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None
    if spec.autoscaling is None:
        return None
    old = body.get("status") or {}
    previous = _previous(old.get("autoscaling"))
    hpa = cluster.hpa_targeting(namespace, name)
    found = _scrape_all(
        cluster.pool_pods(namespace, name), scrape, parse_pod_metrics, f"pool={namespace}/{name}"
    )
    reports = [report for report in found if report is not None]
    # Pods that did not answer carry load the sum leaves out: it may scale up, not down.
    load = observed_load(reports, unread=len(found) - len(reports)) if reports else None
    queues = None
    if routers is not None and routers.serves == namespace:
        queues = _router_queues(cluster, routers, name)
    capacity = replica_capacity(spec, catalog, observed_shape(reports))
    decision = decide(spec.autoscaling, capacity, load, spec.replicas, previous, now, hpa, queues)
    value = ConditionValue("True" if decision.active else "False", decision.reason,
                           decision.message)  # fmt: skip
    old_conditions = _conditions(old.get("conditions"))
    said = next((c.reason for c in old_conditions if c.type == "Autoscaling"), None)
    merged = conditions(
        old_conditions,
        {"Autoscaling": value},
        now=_text(now),
        generation=meta.get("generation"),
    )
    status = {
        "autoscaling": decision.status.model_dump(by_alias=True, exclude_none=True),
        "conditions": [c.model_dump(by_alias=True, exclude_none=True) for c in merged],
    }
    events: list[tuple[EventType, str, str]] = []
    if decision.changes:
        events.append(("Normal", decision.reason, decision.message))
    elif not decision.active and decision.reason != said and decision.reason not in QUIET_REASONS:
        events.append(("Warning", decision.reason, decision.message))
    unknown = decision.status.queues_unknown
    if unknown is not None and (previous is None or previous.queues_unknown is None):
        message = f"{unknown}: the pool is not scaled down until they are read"
        events.append(("Warning", ROUTER_QUEUES_UNKNOWN, message))
    replicas = decision.desired if decision.changes else None
    return Tick(status, replicas, decision, events)


def _router_queues(cluster: Cluster, routers: Routers, pool: str) -> RouterQueues:
    """What waits for `pool` at the ready router pods (a pod not ready takes no requests, so
    it queues none)."""
    try:
        pods = cluster.router_pods(routers.namespace, routers.selector)
    except RoutersUnknown as exc:
        log.info("event=router_pods_unknown pool=%s error=%s", pool, exc)
        return RouterQueues(0, 0, problem=str(exc))
    where = f"pool={routers.serves}/{pool} router"
    return router_queues(pool, _scrape_all(pods, routers.scrape, parse_router_waiting, where))


def _scrape_all(
    pods: list[PodAddress], scrape: Scrape, parse: Callable[[str], T], where: str
) -> list[T | None]:
    """Each ready pod's metrics read with `parse` (None: it did not answer, or not as
    expected), SCRAPE_CONCURRENCY at a time: a hung pod costs its timeout once, not once per
    pod behind it."""
    ready = [pod for pod in pods if pod.ready and pod.ip]

    def read(pod: PodAddress) -> T | None:
        try:
            return parse(scrape(pod))
        except (httpx.HTTPError, httpx.InvalidURL, MetricsError) as exc:
            log.info("event=scrape_failed %s pod=%s error=%s", where, pod.name, exc)
            return None

    if len(ready) <= 1:
        return [read(pod) for pod in ready]
    with ThreadPoolExecutor(min(SCRAPE_CONCURRENCY, len(ready))) as threads:
        return list(threads.map(read, ready))


def _previous(raw: Any) -> AutoscalingStatus | None:
    """The last status written, or None (start the window again) when someone wrote garbage:
    a field of the wrong type, or a time that is not RFC 3339 with a timezone."""
    if not isinstance(raw, dict):
        return None
    try:
        previous = AutoscalingStatus.model_validate(raw)
        for moment in [r.time for r in previous.recommendations] + [previous.observing_since]:
            if moment is not None:
                status_time(moment)
    except (ValidationError, ValueError):
        return None
    return previous


def _conditions(raw: Any) -> list[Condition]:
    found = []
    for item in raw or []:
        try:
            found.append(Condition.model_validate(item))
        except ValidationError:
            continue
    return found


def _text(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
