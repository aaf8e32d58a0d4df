"""`spec.autoscaling` and `status.autoscaling` of an InferencePool.

The operator sizes an autoscaled pool from the load its pods report (requests running and
waiting) and what one replica can carry at the pool's SLO by the performance model. It writes
`spec.replicas` through the scale subresource, as an HPA would; a manual `kubectl scale` is
overridden at its next decision. The decision's inputs that must survive an operator restart
(recent recommendations, the last scale) live in `status.autoscaling`, never in memory.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from .base import Api

__all__ = [
    "DEFAULT_SCALE_DOWN_STABILIZATION_S",
    "DEFAULT_TARGET_UTILIZATION",
    "MIN_ABOVE_MAX",
    "AutoscalingSpec",
    "AutoscalingStatus",
    "Recommendation",
]

DEFAULT_TARGET_UTILIZATION = 0.8
DEFAULT_SCALE_DOWN_STABILIZATION_S = 300

#: Said alike by the CRD's CEL rule and the pydantic model.
MIN_ABOVE_MAX = "spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas"


class AutoscalingSpec(Api):
    """Replicas that follow the pool's load, sized to hold its SLO."""

    min_replicas: int = Field(
        ge=1,
        description=(
            "Fewest replicas. At least 1: load is observed at the pool's pods, and a pool "
            "with none has nothing to observe."
        ),
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    target_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "Share of one replica's capacity the autoscaler plans to use. The capacity is "
            "the most concurrent requests at which the performance model meets spec.slo for "
            "the observed request shape (without spec.slo: the replica's maximum "
            f"concurrency). Default: {DEFAULT_TARGET_UTILIZATION}."
        ),
    )
    scale_down_stabilization_s: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description=(
            "Seconds the load must have needed fewer replicas before the pool scales down "
            "(the largest recommendation of the window is kept); scale-up is immediate. "
            f"Default: {DEFAULT_SCALE_DOWN_STABILIZATION_S}."
        ),
    )

    @model_validator(mode="after")
    def _min_within_max(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise PydanticCustomError("autoscaling_range", MIN_ABOVE_MAX)
        return self

    @property
    def utilization(self) -> float:
        if self.target_utilization is None:
            return DEFAULT_TARGET_UTILIZATION
        return self.target_utilization

    @property
    def stabilization_s(self) -> int:
        if self.scale_down_stabilization_s is None:
            return DEFAULT_SCALE_DOWN_STABILIZATION_S
        return self.scale_down_stabilization_s


class Recommendation(Api):
    """Replicas the load needed at one decision (kept for the scale-down window)."""

    time: str = Field(description="When (RFC 3339).")
    replicas: int = Field(ge=0, description="Replicas recommended then.")


class AutoscalingStatus(Api):
    """What the autoscaler last observed and decided."""

    observed_pods: int = Field(default=0, description="Pods whose metrics were read.")
    observed_running: int = Field(default=0, description="Requests running, all pods.")
    observed_waiting: int = Field(default=0, description="Requests waiting, all pods.")
    observed_queued: int | None = Field(
        default=None,
        description="Requests waiting for this pool in the routers' queues, over the routers "
        "read (unset: the operator is not told where the routers are).",
    )
    observed_routers: int | None = Field(
        default=None, description="Router pods whose queue was read."
    )
    queues_unknown: str | None = Field(
        default=None,
        description="Why some routers' queues are unknown this tick (a router pod that did "
        "not answer, router pods that could not be listed): the demand is then a lower bound "
        "and the pool is not scaled down. Unset when every router was read.",
    )
    observed_input_tokens: int | None = Field(
        default=None, description="Mean prompt tokens per request used for the capacity."
    )
    observed_output_tokens: int | None = Field(
        default=None, description="Mean output tokens per request used for the capacity."
    )
    shape_source: str | None = Field(
        default=None,
        description="observed (the pods' token counters) or spec (spec.workload: too few "
        "requests finished yet).",
    )
    capacity_per_replica: float | None = Field(
        default=None,
        description="Concurrent requests one replica is planned to carry (at the SLO, "
        "times the target utilization).",
    )
    desired_replicas: int | None = Field(default=None, description="Replicas decided.")
    last_scale_time: str | None = Field(
        default=None, description="When the autoscaler last changed spec.replicas."
    )
    last_scale_reason: str | None = Field(
        default=None, description="Why (ScaledUp, ScaledDown, OutOfRange, ...)."
    )
    last_scale_message: str | None = Field(default=None, description="From, to and why.")
    observing_since: str | None = Field(
        default=None,
        description="Since when recommendations were kept without a gap longer than the "
        "window: a scale-down waits until the window has been observed whole.",
    )
    recommendations: list[Recommendation] = Field(
        default_factory=list,
        description="Recommendations within the scale-down window (survive restarts).",
    )
