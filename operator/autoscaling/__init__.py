"""Autoscaling of InferencePools: one replica's capacity at the SLO (capacity), the load the
pods report (load), what waits for the pool at the routers (router_load) and the pure decision
from these and the last status (decide). The kopf timer that scrapes the pods and the routers
and writes the decision is built on these."""

from .capacity import Capacity, RequestShape, replica_capacity
from .decide import (
    REASONS,
    Decision,
    HpaUnknown,
    ObservedLoad,
    RouterQueues,
    decide,
    status_time,
    unread_routers,
)
from .load import MetricsError, PodMetrics, observed_load, observed_shape, parse_pod_metrics
from .router_load import POOL_WAITING, parse_router_waiting, router_queues

__all__ = [
    "REASONS",
    "Capacity",
    "Decision",
    "HpaUnknown",
    "POOL_WAITING",
    "MetricsError",
    "ObservedLoad",
    "PodMetrics",
    "RequestShape",
    "RouterQueues",
    "decide",
    "observed_load",
    "observed_shape",
    "parse_pod_metrics",
    "parse_router_waiting",
    "replica_capacity",
    "router_queues",
    "status_time",
    "unread_routers",
]
