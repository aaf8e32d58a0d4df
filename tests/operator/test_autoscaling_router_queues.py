"""What waits for a pool at the routers, in the decision: read from each router's metrics
text, added to the pods' load so one tick sees a step whole, and, when a router could not be
read (no answer, garbage, negative values), a lower bound: up on it, never down, whatever
the window held before."""

from __future__ import annotations

import datetime

import pytest

from tiergate.operator.autoscaling import (
    POOL_WAITING,
    Capacity,
    Decision,
    MetricsError,
    ObservedLoad,
    RequestShape,
    RouterQueues,
    decide,
    parse_router_waiting,
    router_queues,
)
from tiergate.pools import AutoscalingSpec, AutoscalingStatus

T0 = datetime.datetime(2026, 11, 21, tzinfo=datetime.UTC)
POLICY = AutoscalingSpec(min_replicas=1, max_replicas=8, target_utilization=1.0,
                         scale_down_stabilization_s=60)  # fmt: skip
FOUR = Capacity(RequestShape(512, 100), 4)  # one replica carries 4 concurrent requests


def router_text(**waiting: float) -> str:
    lines = [f"# HELP {POOL_WAITING} Requests waiting.", f"# TYPE {POOL_WAITING} gauge"]
    lines += [f'{POOL_WAITING}{{pool="{p}",tier="batched"}} {v}' for p, v in waiting.items()]
    return "\n".join(lines) + "\n"


def tick(
    s: float, running: int, routers: RouterQueues | None, current: int,
    previous: AutoscalingStatus | None = None,
) -> Decision:  # fmt: skip
    load = ObservedLoad(current, running, 0)
    now = T0 + datetime.timedelta(seconds=s)
    return decide(POLICY, FOUR, load, current, previous, now, None, routers)


def test_a_router_s_queue_is_read_per_pool_summed_over_its_tiers() -> None:
    text = router_text(chat=6.5, other=2) + 'tiergate_queue_depth{tier="batched"} 3\n'
    assert parse_router_waiting(text) == {"chat": 6.5, "other": 2.0}
    assert parse_router_waiting(router_text()) == {}  # a router with no pool: nothing waits


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("vllm:num_requests_running 3\n", "not a router's metrics"),
        ("}{ not prometheus", "unreadable metrics"),
        (router_text(chat=-1), "is -1"),
        (router_text(chat=float("nan")), "is nan"),
        (router_text(chat=float("inf")), "is inf"),
        (f'# TYPE {POOL_WAITING} gauge\n{POOL_WAITING}{{tier="batched"}} 2\n', "pool label"),
    ],
)
def test_metrics_that_are_not_a_router_s_or_hold_impossible_values_are_refused(
    text: str, problem: str
) -> None:
    with pytest.raises(MetricsError, match=problem):
        parse_router_waiting(text)


def test_the_routers_reports_add_up_and_the_unread_are_counted() -> None:
    reports = [{"chat": 3.4, "other": 9.0}, None, {"chat": 4.4}]
    assert router_queues("chat", reports) == RouterQueues(3, 8, unread=1)
    assert router_queues("chat", []) == RouterQueues(0, 0)  # no router serving: none queued
    assert router_queues("chat", []).complete


def test_what_waits_at_the_routers_takes_one_tick_to_the_replicas_needed() -> None:
    alone = tick(0, 4, None, 1)  # the pods alone: one batch of 4 -> 1 replica
    assert (alone.desired, alone.status.observed_queued) == (1, None)
    d = tick(0, 4, RouterQueues(2, 8), 1)  # 4 running + 8 queued at two routers
    assert (d.desired, d.reason) == (3, "ScaledUp")
    assert "12 concurrent requests (4 running, 0 waiting on 1 pods, 8 queued at 2 routers)" in (
        d.message
    )
    status = d.status
    assert (status.observed_queued, status.observed_routers, status.queues_unknown) == (8, 2, None)


def test_an_unread_router_scales_up_on_what_is_known_but_never_down() -> None:
    up = tick(0, 4, RouterQueues(2, 8, unread=1), 1)
    assert up.desired == 3  # a lower bound is still more than one replica carries
    assert up.status.queues_unknown == "1 of 2 routers did not report their queue"
    assert "not scaling down until they are read" in up.message
    # The load is gone, the window long passed, but one router is unread: hold.
    held = tick(120, 0, RouterQueues(2, 0, unread=1), 3, up.status)
    assert (held.desired, held.reason) == (3, "Holding")
    # Its recommendation is the current count, so the window does not scale down later on it.
    assert [r.replicas for r in held.status.recommendations] == [3]
    # Read again: down only once the held 3 has left the 60 s window.
    status, replicas, seen = held.status, 3, []
    for s in range(135, 241, 15):
        d = tick(s, 0, RouterQueues(2, 0), replicas, status)
        status, replicas = d.status, d.desired
        seen.append((s, replicas))
    assert status.queues_unknown is None
    assert [s for s, r in seen if r == 1][0] >= 120 + 60, seen


def test_routers_that_cannot_be_listed_hold_the_pool_and_say_why() -> None:
    up = tick(0, 8, RouterQueues(0, 0, problem="the operator may not list pods in ns"), 4)
    assert up.desired == 4  # 8 running need only 2, but nothing is known of the queues
    assert up.status.queues_unknown == (
        "the routers' queues are unknown: the operator may not list pods in ns"
    )


def test_a_reading_is_never_carried_over_to_the_next_tick() -> None:
    first = tick(0, 4, RouterQueues(1, 8), 1)
    assert first.status.observed_queued == 8
    # The routers are no longer read (say the operator lost its --router-* flags): the last
    # tick's queue is neither kept in the status nor counted.
    after = tick(15, 4, None, 3, first.status)
    assert (after.status.observed_queued, after.status.observed_routers) == (None, None)
    assert "queued" not in after.message
    unread = tick(30, 4, RouterQueues(1, 0, unread=1), 3, after.status)
    assert unread.status.observed_queued == 0 and unread.desired == 3
