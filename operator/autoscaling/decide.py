"""The autoscaling decision: observed load, one replica's capacity, the last status and the
time in; desired replicas, why, and the status to write out. Pure.

Scale up at once to what the load needs; scale down only to the largest recommendation of
the stabilisation window, and only once the window has been observed whole. The window lives
in `status.autoscaling` (recommendations, `observingSince`), so an operator restart changes
nothing: the same observations and status give the same decision. A manual `kubectl scale`
(spec.replicas differs from the last decision) is overridden: the decision is made from the
last decided count, as if the edit had not happened.

The demand is what the pods run and queue plus what waits for the pool at the routers
(router_load.py), so one tick sees a step whole. When a router's queue could not be read the
demand is known only from below: the decision scales up on it but never down, and the
recommendation it keeps for the window is at least the current count, so that a window of
partial readings cannot scale down later either.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

from tiergate.pools import AutoscalingSpec, AutoscalingStatus, Recommendation

from .capacity import Capacity

__all__ = [
    "REASONS",
    "Decision",
    "HpaUnknown",
    "ObservedLoad",
    "RouterQueues",
    "decide",
    "status_time",
    "unread_routers",
]

#: Every reason a decision can give: the autoscaler acting (the first five) or holding because
#: it cannot (the rest).
REASONS = (
    "ScaledUp", "ScaledDown", "OutOfRange", "ManualScaleOverridden", "Holding", "AtMaximum",
    "NoMetrics", "HpaConflict", "HpaUnknown", "InvalidSpec", "ModelDoesNotFit", "SloUnreachable",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class HpaUnknown:
    """Whether a HorizontalPodAutoscaler scales the pool cannot be told: the operator may not
    list them. Not "none": an HPA it cannot see would fight it over spec.replicas."""

    #: The grant that is missing, in RBAC's words.
    missing: str


@dataclass(frozen=True, slots=True)
class ObservedLoad:
    """Requests running and waiting, summed over the pool's pods that reported; `unread`
    ready pods did not (their load is unknown, so the sum is a lower bound)."""

    pods: int
    running: int
    waiting: int
    unread: int = 0

    @property
    def demand(self) -> int:
        """Concurrent requests the pool is asked to carry."""
        return self.running + self.waiting


@dataclass(frozen=True, slots=True)
class RouterQueues:
    """Requests waiting at the routers for one pool, summed over the router pods that reported;
    `unread` router pods did not (their queue is unknown); `problem`: why none could be
    listed at all (then `routers` and `waiting` are 0 and the demand is incomplete)."""

    routers: int
    waiting: int
    unread: int = 0
    problem: str | None = None

    @property
    def complete(self) -> bool:
        """Every router's queue is in `waiting`."""
        return self.unread == 0 and self.problem is None


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do, and what to say about it."""

    current: int
    desired: int
    #: One of REASONS.
    reason: str
    message: str
    #: The Autoscaling condition's status: False when the autoscaler cannot act.
    active: bool
    status: AutoscalingStatus

    @property
    def changes(self) -> bool:
        return self.desired != self.current


def decide(
    policy: AutoscalingSpec,
    capacity: Capacity,
    load: ObservedLoad | None,
    current: int,
    previous: AutoscalingStatus | None,
    now: datetime.datetime,
    hpa: str | HpaUnknown | None = None,
    routers: RouterQueues | None = None,
) -> Decision:
    """The decision for one pool at `now` (timezone-aware). `current`: spec.replicas;
    `load` None: no pod could be read; `previous`: the last status, its times readable by
    `status_time` (the caller drops one that is not); `hpa`: the name of an HPA targeting the
    pool, or HpaUnknown when the HPAs could not be listed; `routers`: what waits for the pool
    at the routers (None: the operator is not told where the routers are)."""
    previous = previous or AutoscalingStatus()
    window = datetime.timedelta(seconds=policy.stabilization_s)
    kept = [r for r in previous.recommendations if status_time(r.time) > now - window]
    since = previous.observing_since if kept and previous.observing_since else _text(now)
    shape = capacity.shape
    status = previous.model_copy(
        update={
            "observed_input_tokens": shape.input_tokens,
            "observed_output_tokens": shape.output_tokens,
            "shape_source": shape.source,
            "recommendations": kept,
            "observing_since": since,
        }
    )
    if load is not None:
        status = status.model_copy(
            update={
                "observed_pods": load.pods,
                "observed_running": load.running,
                "observed_waiting": load.waiting,
            }
        )
    # Each tick's own reading of the routers: none carries over from the last status.
    status = status.model_copy(
        update={
            "observed_routers": routers.routers - routers.unread if routers else None,
            "observed_queued": routers.waiting if routers else None,
            "queues_unknown": None if not routers or routers.complete else unread_routers(routers),
        }
    )

    def hold(reason: str, message: str, active: bool) -> Decision:
        held = status.model_copy(update={"desired_replicas": current})
        return Decision(current, current, reason, message, active, held)

    if isinstance(hpa, HpaUnknown):
        message = (
            "cannot tell whether a HorizontalPodAutoscaler also scales this pool: the "
            f"operator may not {hpa.missing}; holding (grant it, as the chart's Role does)"
        )
        return hold("HpaUnknown", message, False)
    if hpa is not None:
        message = (
            f"HorizontalPodAutoscaler {hpa} also scales this pool: tiergate stands down "
            "(delete the HPA or spec.autoscaling)"
        )
        return hold("HpaConflict", message, False)
    if capacity.problem is not None or capacity.concurrency is None:
        reason, message = capacity.problem or ("InvalidSpec", "no capacity")
        return hold(reason, message + "; replicas left as they are", False)
    per_replica = capacity.concurrency * policy.utilization
    status = status.model_copy(update={"capacity_per_replica": round(per_replica, 2)})
    low, high = policy.min_replicas, policy.max_replicas
    base = previous.desired_replicas if previous.desired_replicas is not None else current
    if load is None or load.pods == 0:
        if low <= current <= high:
            return hold("NoMetrics", "no pod of the pool reported its load: holding", False)
        load = ObservedLoad(0, 0, 0)  # out of range: back within it, whatever the load
        base = current
    queued = routers.waiting if routers is not None else 0
    partial = (routers is not None and not routers.complete) or load.unread > 0
    demand = load.demand + queued
    needed = math.ceil(demand / per_replica - 1e-9)
    recommended = min(max(needed, low), high)
    if partial:  # a lower bound: it may raise the count, never lower it
        recommended = max(recommended, min(base, high))
    kept = _dominant([*kept, Recommendation(time=_text(now), replicas=recommended)])
    status = status.model_copy(update={"recommendations": kept})
    observed_whole = status_time(since) <= now - window
    stable = max(r.replicas for r in kept)
    if recommended > base or base < low:
        desired = max(recommended, low)
    elif base > high:
        desired = min(high, stable) if observed_whole else high
    elif observed_whole:
        desired = min(base, stable)
    else:
        desired = base
    at_routers = ""
    if routers is not None:
        read = routers.routers - routers.unread
        at_routers = f", {queued} queued at {read} router{'' if read == 1 else 's'}"
    why = (
        f"{demand} concurrent requests ({load.running} running, {load.waiting} waiting "
        f"on {load.pods} pods{at_routers}) / {per_replica:.1f} per replica at the SLO"
    )
    reason = _reason(desired, current, base, low, high, needed)
    message = f"{current} -> {desired} replicas: {why}" if desired != current else why
    if needed > high:
        message += f"; the load needs {needed} replicas, more than maxReplicas {high}"
    elif desired > recommended:
        message += f"; scaling down to {stable} after the {policy.stabilization_s} s window"
    if routers is not None and not routers.complete:
        message += f"; {unread_routers(routers)}: not scaling down until they are read"
    if load.unread:
        message += (
            f"; {load.unread} of {load.pods + load.unread} ready pods did not report their "
            "load: not scaling down until they are read"
        )
    status = status.model_copy(update={"desired_replicas": desired})
    if desired != current:
        status = status.model_copy(
            update={
                "last_scale_time": _text(now),
                "last_scale_reason": reason,
                "last_scale_message": message,
            }
        )
    return Decision(current, desired, reason, message, True, status)


def unread_routers(routers: RouterQueues) -> str:
    """Why some routers' queues are unknown."""
    if routers.problem is not None:
        return f"the routers' queues are unknown: {routers.problem}"
    return f"{routers.unread} of {routers.routers} routers did not report their queue"


def _reason(desired: int, current: int, base: int, low: int, high: int, needed: int) -> str:
    if desired != current and base != current:
        return "ManualScaleOverridden"
    if desired != current and not low <= current <= high:
        return "OutOfRange"
    if desired > current:
        return "ScaledUp"
    if desired < current:
        return "ScaledDown"
    return "AtMaximum" if needed > high else "Holding"


def _dominant(recommendations: list[Recommendation]) -> list[Recommendation]:
    """Those that can still be the window's largest: none with a later one at least as big
    (the window's maximum in a list a few entries long, whatever the window's length)."""
    out: list[Recommendation] = []
    for r in recommendations:
        while out and out[-1].replicas <= r.replicas:
            out.pop()
        out.append(r)
    return out


def status_time(text: str) -> datetime.datetime:
    """A time of `status.autoscaling` (RFC 3339); ValueError when it is not one, or names no
    timezone (it cannot be compared with the tick's)."""
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} names no timezone")
    return moment


def _text(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
