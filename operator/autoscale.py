"""One autoscaling tick of one InferencePool: scrape its ready pods, decide, and say what to
write, in which order, and what to tell people. The kopf timer only performs it.

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
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from tiergate.pools import AutoscalingStatus, Condition, InferencePoolSpec
from tiergate.sim_nodes.catalogs import Catalog

from .autoscaling import (
    Decision,
    MetricsError,
    PodMetrics,
    decide,
    observed_load,
    observed_shape,
    parse_pod_metrics,
    replica_capacity,
)
from .kube import Cluster, PodAddress
from .render import CONTAINER_PORT
from .status import ConditionValue, conditions

__all__ = ["AUTOSCALE_INTERVAL_S", "MetricsScraper", "Tick", "autoscale"]

log = logging.getLogger("tiergate.operator")

Manifest = dict[str, Any]
EventType = Literal["Normal", "Warning"]

#: Seconds between two autoscaling decisions of a pool.
AUTOSCALE_INTERVAL_S = 15
#: A pod that does not answer its scrape within this long is left out of the tick.
SCRAPE_TIMEOUT_S = 2.0
#: Pods of one pool scraped at once.
SCRAPE_CONCURRENCY = 16
#: Reasons the autoscaler cannot act for that get no Warning (said by the condition alone).
QUIET_REASONS = frozenset({"NoMetrics"})


class MetricsScraper:
    """GETs a pod's `/metrics` on the sim node's port (tests inject an httpx transport)."""

    def __init__(
        self, transport: httpx.BaseTransport | None = None, timeout_s: float = SCRAPE_TIMEOUT_S
    ) -> None:
        self._client = httpx.Client(transport=transport, timeout=timeout_s)

    def __call__(self, pod: PodAddress) -> str:
        """The metrics text; raises httpx.HTTPError when the pod cannot be read."""
        reply = self._client.get(f"http://{pod.ip}:{CONTAINER_PORT}/metrics")
        reply.raise_for_status()
        return reply.text


Scrape = Callable[[PodAddress], str]


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
) -> Tick | None:
    """The tick for `body` at `now` (timezone-aware); None when the pool is not autoscaled
    or its spec is invalid (reconciliation reports that)."""
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
    reports = _scrape_ready(cluster.pool_pods(namespace, name), scrape, f"{namespace}/{name}")
    load = observed_load(reports) if reports else None
    capacity = replica_capacity(spec, catalog, observed_shape(reports))
    decision = decide(spec.autoscaling, capacity, load, spec.replicas, previous, now, hpa)
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
    replicas = decision.desired if decision.changes else None
    return Tick(status, replicas, decision, events)


def _scrape_ready(pods: list[PodAddress], scrape: Scrape, pool: str) -> list[PodMetrics]:
    """The reports of the ready pods that answered, scraped SCRAPE_CONCURRENCY at a time (a
    hung pod costs its timeout once, not once per pod behind it); the others are left out."""
    ready = [pod for pod in pods if pod.ready and pod.ip]

    def read(pod: PodAddress) -> PodMetrics | None:
        try:
            return parse_pod_metrics(scrape(pod))
        except (httpx.HTTPError, MetricsError) as exc:
            log.info("event=scrape_failed pool=%s pod=%s error=%s", pool, pod.name, exc)
            return None

    if len(ready) <= 1:
        found = [read(pod) for pod in ready]
    else:
        with ThreadPoolExecutor(min(SCRAPE_CONCURRENCY, len(ready))) as threads:
            found = list(threads.map(read, ready))
    return [report for report in found if report is not None]


def _previous(raw: Any) -> AutoscalingStatus | None:
    if not isinstance(raw, dict):
        return None
    try:
        return AutoscalingStatus.model_validate(raw)
    except ValidationError:
        return None  # someone wrote garbage: start the window again


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
