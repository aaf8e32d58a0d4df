"""Autoscaling of InferencePools: one replica's capacity at the SLO (capacity), the load the
pods report (load) and the pure decision from both and the last status (decide). The kopf
timer that scrapes the pods and writes the decision is built on these."""

from .capacity import Capacity, RequestShape, replica_capacity
from .decide import REASONS, Decision, HpaUnknown, ObservedLoad, decide
from .load import MetricsError, PodMetrics, observed_load, observed_shape, parse_pod_metrics

__all__ = [
    "REASONS",
    "Capacity",
    "Decision",
    "HpaUnknown",
    "MetricsError",
    "ObservedLoad",
    "PodMetrics",
    "RequestShape",
    "decide",
    "observed_load",
    "observed_shape",
    "parse_pod_metrics",
    "replica_capacity",
]
