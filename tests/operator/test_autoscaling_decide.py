"""The autoscaling decision on a fake clock: up at once, down after a whole window, within
[min, max], manual scales overridden, bad inputs held with their numbers, and the same
decision after a restart (everything it needs is in the status)."""

from __future__ import annotations

import datetime

import pytest

from tiergate.operator.autoscaling import (
    Capacity,
    Decision,
    HpaUnknown,
    ObservedLoad,
    RequestShape,
    decide,
    replica_capacity,
)
from tiergate.pools import AutoscalingSpec, AutoscalingStatus, InferencePoolSpec, SloSpec
from tiergate.sim_nodes.catalogs import default_catalog

T0 = datetime.datetime(2026, 11, 21, tzinfo=datetime.UTC)
POLICY = AutoscalingSpec(min_replicas=1, max_replicas=4, target_utilization=1.0,
                         scale_down_stabilization_s=300)  # fmt: skip
TEN = Capacity(RequestShape(2048, 512), 10)  # one replica carries 10 concurrent requests


def at(s: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=s)


def load(demand: int, pods: int = 1) -> ObservedLoad:
    return ObservedLoad(pods, demand, 0)


class Pool:
    """spec.replicas and status.autoscaling, written back as the operator would."""

    def __init__(self, replicas: int = 1) -> None:
        self.replicas = replicas
        self.status: AutoscalingStatus | None = None

    def tick(self, s: float, demand: int, capacity: Capacity = TEN) -> Decision:
        d = decide(POLICY, capacity, load(demand), self.replicas, self.status, at(s))
        self.replicas, self.status = d.desired, d.status
        return d


def test_scales_up_at_once_to_what_the_load_needs() -> None:
    pool = Pool()
    assert pool.tick(0, 5).reason == "Holding"
    d = pool.tick(15, 31)
    assert (d.current, d.desired, d.reason) == (1, 4, "ScaledUp")
    assert d.status.last_scale_reason == "ScaledUp" and d.status.last_scale_time is not None
    assert "31 concurrent requests" in d.message


def test_never_above_max_and_says_the_shortfall() -> None:
    pool = Pool(4)
    d = pool.tick(0, 95)
    assert d.desired == 4 and d.reason == "AtMaximum"
    assert "needs 10 replicas, more than maxReplicas 4" in d.message


def test_scales_down_only_after_a_whole_window_to_its_largest_recommendation() -> None:
    pool = Pool()
    pool.tick(0, 35)
    assert pool.replicas == 4
    for s in range(15, 300, 15):  # the load drops; still within the window
        assert pool.tick(s, 15 if s < 150 else 5).desired == 4
    # the window (300 s) since the first observation has passed; 150 s ago it needed 2
    d = pool.tick(300, 5)
    assert (d.desired, d.reason) == (2, "ScaledDown")
    assert pool.tick(450, 5).desired == 1


def test_never_below_min() -> None:
    pool = Pool(1)
    for s in range(0, 900, 15):
        assert pool.tick(s, 0).desired == 1


def test_the_window_survives_a_restart_but_not_a_gap_longer_than_itself() -> None:
    pool = Pool()
    pool.tick(0, 35)
    pool.tick(100, 5)
    # a new operator: nothing in memory, the status as written
    status = AutoscalingStatus.model_validate(pool.status.model_dump(by_alias=True))  # type: ignore[union-attr]
    d = decide(POLICY, TEN, load(5), 4, status, at(200))
    assert d.desired == 4, "the window is still open"
    d = decide(POLICY, TEN, load(5), 4, status, at(301))
    assert d.desired == 1, "the window was observed whole (0 .. 300 s)"
    # operator down for longer than the window: start observing again before scaling down
    d = decide(POLICY, TEN, load(5), 4, status, at(2000))
    assert d.desired == 4 and d.status.observing_since == "2026-11-21T00:33:20Z"


def test_the_same_inputs_give_the_same_decision() -> None:
    pool = Pool()
    pool.tick(0, 25)
    again = decide(POLICY, TEN, load(25), pool.replicas, pool.status, at(15))
    assert again.desired == pool.replicas and not again.changes


@pytest.mark.parametrize(("manual", "expected"), [(4, 2), (1, 2)])
def test_a_manual_scale_is_overridden(manual: int, expected: int) -> None:
    pool = Pool()
    pool.tick(0, 15)
    assert pool.replicas == 2
    d = decide(POLICY, TEN, load(15), manual, pool.status, at(15))
    assert (d.current, d.desired, d.reason) == (manual, expected, "ManualScaleOverridden")


def test_replicas_outside_the_range_are_brought_back_even_without_metrics() -> None:
    d = decide(POLICY, TEN, None, 9, None, T0)
    assert (d.desired, d.reason) == (4, "OutOfRange")
    d = decide(POLICY, TEN, ObservedLoad(0, 0, 0), 0, None, T0)
    assert (d.desired, d.reason) == (1, "OutOfRange")


def test_no_metrics_holds() -> None:
    d = decide(POLICY, TEN, None, 3, None, T0)
    assert (d.desired, d.reason, d.active) == (3, "NoMetrics", False)


def test_an_hpa_on_the_pool_makes_tiergate_stand_down() -> None:
    d = decide(POLICY, TEN, load(95), 1, None, T0, hpa="web")
    assert (d.desired, d.reason, d.active) == (1, "HpaConflict", False)
    assert "HorizontalPodAutoscaler web" in d.message


def test_hpas_that_cannot_be_listed_hold_the_pool_whatever_the_load() -> None:
    d = decide(POLICY, TEN, load(95), 1, None, T0, hpa=HpaUnknown("list them in team-a"))
    assert (d.desired, d.reason, d.active) == (1, "HpaUnknown", False)
    assert "list them in team-a" in d.message and "holding" in d.message


def test_target_utilization_leaves_headroom() -> None:
    policy = POLICY.model_copy(update={"target_utilization": 0.5})
    d = decide(policy, TEN, load(10), 1, None, T0)
    assert d.desired == 2 and d.status.capacity_per_replica == 5


# -- capacity from the performance model, and the bad inputs of the issue ----------------------


def spec(**changes: object) -> InferencePoolSpec:
    base: dict[str, object] = {
        "tier": "batched", "model": "llama-3.1-8b", "accelerator": "h100-sxm",
        "batching": {"maxNumSeqs": 64},
        "workload": {"inputTokens": 1024, "outputTokens": 256},
        "autoscaling": {"minReplicas": 1, "maxReplicas": 4},
    }  # fmt: skip
    return InferencePoolSpec.model_validate({**base, **changes})


def test_capacity_holds_the_slo_and_tightens_with_it() -> None:
    loose = replica_capacity(spec(slo={"ttftMs": 1000, "tpotMs": 50}), default_catalog())
    tight = replica_capacity(spec(slo={"ttftMs": 1000, "tpotMs": 12}), default_catalog())
    free = replica_capacity(spec(), default_catalog())
    assert loose.problem is None and tight.problem is None
    assert free.concurrency == 64  # no SLO: the batch cap
    assert loose.concurrency is not None and tight.concurrency is not None
    assert 0 < tight.concurrency < loose.concurrency <= 64


def test_longer_observed_requests_lower_the_capacity() -> None:
    s = spec(slo=SloSpec(ttft_ms=1000, tpot_ms=12).model_dump(by_alias=True))
    short = replica_capacity(s, default_catalog(), RequestShape(512, 128, "observed"))
    long = replica_capacity(s, default_catalog(), RequestShape(16000, 1024, "observed"))
    assert short.concurrency is not None and long.concurrency is not None
    assert long.concurrency < short.concurrency


def test_an_slo_missed_at_batch_1_is_reported_with_numbers_and_nothing_scales() -> None:
    capacity = replica_capacity(spec(slo={"tpotMs": 0.1}), default_catalog())
    assert capacity.concurrency is None and capacity.problem is not None
    reason, message = capacity.problem
    assert reason == "SloUnreachable"
    assert "even at batch 1" in message and "> target 0.1 ms" in message
    d = decide(POLICY, capacity, load(95), 2, None, T0)
    assert (d.desired, d.reason, d.active) == (2, "SloUnreachable", False)
    assert "replicas left as they are" in d.message


def test_a_model_that_does_not_fit_is_reported_and_nothing_scales() -> None:
    capacity = replica_capacity(
        spec(model="llama-3.1-405b", accelerator="a100-40gb", chips=1), default_catalog()
    )
    assert capacity.problem is not None and capacity.problem[0] == "ModelDoesNotFit"
    assert "GB per chip" in capacity.problem[1]
    d = decide(POLICY, capacity, load(95), 1, None, T0)
    assert (d.desired, d.reason) == (1, "ModelDoesNotFit")
