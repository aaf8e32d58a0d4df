"""Autoscaling of InferencePools: one replica's capacity at the SLO (capacity) and the pure
decision from observed load and the last status (decide). The kopf timer that reads the
pods' metrics and writes the decision is built on these."""

from .capacity import Capacity, RequestShape, replica_capacity
from .decide import Decision, ObservedLoad, decide

__all__ = ["Capacity", "Decision", "ObservedLoad", "RequestShape", "decide", "replica_capacity"]
