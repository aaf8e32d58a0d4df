"""The autoscaling timer on a fake cluster and a fake clock: pods scraped through an httpx
MockTransport serving a sim node's metrics text, the status written before the scale, one
Warning per problem, and a restarted operator deciding the same."""

from __future__ import annotations

import datetime
import re
import threading
from typing import Any

import httpx
import kopf
import pytest
from operator_helpers import CATALOG, IMAGE, FakeCluster, conditions, pool, tpot_ms

from tiergate.operator.autoscale import MetricsScraper
from tiergate.operator.autoscaling import HpaUnknown
from tiergate.operator.handlers import OperatorMemo, inferencepool_autoscale
from tiergate.operator.kube import PodAddress
from tiergate.operator.reconcile import reconcile
from tiergate.sim_nodes.server.metrics import NodeMetrics

NS, NAME = "team-a", "frontier-premium"
START = datetime.datetime(2026, 11, 21, tzinfo=datetime.UTC)
TICK = datetime.timedelta(seconds=15)
# One replica of the premium example carries 2 requests beside its 2 background sequences
# (batch cap 4); at the default 0.8 utilisation, 1.6.


class Engine:
    """The engine state a sim node's metrics read at scrape time."""

    def __init__(self, running: int, waiting: int, background: int) -> None:
        self.num_running = running + background  # the engine counts the background as running
        self.num_waiting = waiting
        self.kv_usage = 0.5
        self.num_preemptions = 0
        self.background_sequences = background


class Fleet:
    """Pods of the pool, their load (running, waiting), and the scrapes they answer."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.load: dict[str, tuple[int, int]] = {}
        self.down: set[str] = set()
        self.running_reads: dict[str, str] = {}  # host -> its running gauge's text, e.g. NaN
        self.together: threading.Barrier | None = None  # scrapes that must be in flight at once

    def set(self, *loads: tuple[int, int], ready: bool = True, network: str = "10.0.0.") -> None:
        """Pods with these (running, waiting) loads, at `network` + 1, 2, ... (an IPv6
        network: "fd00::")."""
        self.load = {f"{network}{i + 1}": load for i, load in enumerate(loads)}
        pods = [PodAddress(f"p{i}", ip, ready) for i, ip in enumerate(self.load)]
        self.cluster.pods[(NS, NAME)] = pods

    def transport(self) -> httpx.MockTransport:
        def reply(request: httpx.Request) -> httpx.Response:
            host = request.url.host
            if host in self.down:
                raise httpx.ConnectError("connection refused", request=request)
            if self.together is not None:
                try:
                    self.together.wait()
                except threading.BrokenBarrierError:
                    raise httpx.ReadTimeout("no answer", request=request) from None
            metrics = NodeMetrics("frontier")
            metrics.attach_engine(Engine(*self.load[host], background=2))
            text = metrics.render().decode()
            if host in self.running_reads:
                gauge = r"^(vllm:num_requests_running\{[^}]*\}) \S+$"
                text = re.sub(gauge, rf"\1 {self.running_reads[host]}", text, flags=re.M)
            return httpx.Response(200, content=text)

        return httpx.MockTransport(reply)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime.datetime:
        return self.now


def setup(**spec: Any) -> tuple[FakeCluster, Fleet, Clock, list[tuple[str, str, str]]]:
    spec.setdefault("autoscaling", {"minReplicas": 1, "maxReplicas": 4,
                                    "scaleDownStabilizationS": 60})  # fmt: skip
    cluster = FakeCluster()
    cluster.pools[(NS, NAME)] = pool(**spec)
    return cluster, Fleet(cluster), Clock(), []


def memo_of(
    cluster: FakeCluster, fleet: Fleet, clock: Clock, events: list[tuple[str, str, str]]
) -> OperatorMemo:
    def post(kind: str) -> Any:
        return lambda body, *, reason, message: events.append((kind, reason, message))

    return OperatorMemo(
        catalog=CATALOG,
        images=IMAGE,
        cluster=cluster,
        warn=post("Warning"),
        inform=post("Normal"),
        scrape=MetricsScraper(transport=fleet.transport()),
        clock=clock,
    )


def tick(cluster: FakeCluster, memo: OperatorMemo) -> None:
    inferencepool_autoscale(body=kopf.Body(cluster.pools[(NS, NAME)]), memo=memo)


def replicas(cluster: FakeCluster) -> int:
    return int(cluster.pools[(NS, NAME)]["spec"]["replicas"])


def status(cluster: FakeCluster) -> dict[str, Any]:
    return dict(cluster.pools[(NS, NAME)]["status"])


def replicas_over(ticks: int, cluster: FakeCluster, memo: OperatorMemo, clock: Clock) -> list[int]:
    """The pool's replicas after each of `ticks` more ticks, a tick interval apart."""
    seen = []
    for _ in range(ticks):
        clock.now += TICK
        tick(cluster, memo)
        seen.append(replicas(cluster))
    return seen


def test_scales_up_at_once_writing_the_status_first() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((4, 6))  # 10 requests / 1.6 per replica: 7, held to maxReplicas 4
    tick(cluster, memo)
    assert [(what, value) for what, _, value in cluster.writes][1:] == [("scale", 4)]
    written = cluster.writes[0][2]
    assert written["autoscaling"]["desiredReplicas"] == 4
    assert written["autoscaling"]["observedRunning"] == 4  # the 2 background ones left out
    assert conditions(written)["Autoscaling"]["reason"] == "ScaledUp"
    assert replicas(cluster) == 4
    assert [(kind, reason) for kind, reason, _ in events] == [("Normal", "ScaledUp")]


def test_scales_down_to_min_once_the_window_is_observed_whole() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((4, 6))
    tick(cluster, memo)
    fleet.set((0, 0), (0, 0), (0, 0), (0, 0))
    seen = replicas_over(6, cluster, memo, clock)
    assert seen == [4, 4, 4, 1, 1, 1]  # 60 s after observing began: back to min
    assert [reason for _, reason, _ in events] == ["ScaledUp", "ScaledDown"]


def test_a_restarted_operator_decides_the_same() -> None:
    cluster, fleet, clock, events = setup()
    fleet.set((4, 6))
    tick(cluster, memo_of(cluster, fleet, clock, events))
    fleet.set((1, 0), (0, 0), (0, 0), (0, 0))  # the load drops as the operator restarts
    for _ in range(3):
        clock.now += TICK
        tick(cluster, memo_of(cluster, fleet, clock, events))  # a fresh memo every tick
        assert replicas(cluster) == 4  # no flapping: the window is in the status
    clock.now += TICK
    tick(cluster, memo_of(cluster, fleet, clock, events))
    assert replicas(cluster) == 1


def test_an_hpa_is_reported_once_and_nothing_scaled() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    cluster.hpas[(NS, NAME)] = "premium-hpa"
    fleet.set((4, 6))
    for _ in range(3):
        tick(cluster, memo)
        clock.now += TICK
    assert [what for what, _, _ in cluster.writes] == ["status"] * 3
    condition = conditions(status(cluster))["Autoscaling"]
    assert (condition["status"], condition["reason"]) == ("False", "HpaConflict")
    assert "premium-hpa" in condition["message"]
    assert [(kind, reason) for kind, reason, _ in events] == [("Warning", "HpaConflict")]


def test_hpas_the_operator_may_not_list_hold_the_pool_and_say_which_grant_is_missing() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    cluster.hpas[(NS, NAME)] = HpaUnknown(f"list horizontalpodautoscalers.autoscaling in {NS}")
    fleet.set((4, 6))
    for _ in range(3):
        tick(cluster, memo)
        clock.now += TICK
    assert [what for what, _, _ in cluster.writes] == ["status"] * 3  # never scaled
    condition = conditions(status(cluster))["Autoscaling"]
    assert (condition["status"], condition["reason"]) == ("False", "HpaUnknown")
    assert f"list horizontalpodautoscalers.autoscaling in {NS}" in condition["message"]
    assert [(kind, reason) for kind, reason, _ in events] == [("Warning", "HpaUnknown")]
    del cluster.hpas[(NS, NAME)]  # granted: the autoscaler acts on the next tick
    tick(cluster, memo)
    assert replicas(cluster) == 4


def test_an_unreachable_slo_warns_once_with_numbers_and_scales_nothing() -> None:
    cluster, fleet, clock, events = setup(slo={"tpotMs": 0.01})
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((4, 6))
    tick(cluster, memo)
    tick(cluster, memo)
    assert replicas(cluster) == 1
    assert [(kind, reason) for kind, reason, _ in events] == [("Warning", "SloUnreachable")]
    # premium.yaml: batch 1 beside its 2 background sequences is 3 streams.
    assert f"TPOT {tpot_ms(3):.2f} ms > target 0.01 ms" in events[0][2]


def test_pods_that_do_not_answer_or_are_not_ready_are_left_out() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((1, 0), (4, 6))
    fleet.down.add("10.0.0.2")
    tick(cluster, memo)
    assert status(cluster)["autoscaling"]["observedPods"] == 1
    # 1 request: one replica carries it (2 beside its background, at 0.8 utilisation)
    assert replicas(cluster) == 1
    fleet.set((4, 6), ready=False)  # only pods that are not ready: no metrics, hold
    clock.now += TICK
    tick(cluster, memo)
    condition = conditions(status(cluster))["Autoscaling"]
    assert (condition["status"], condition["reason"]) == ("False", "NoMetrics")
    assert replicas(cluster) == 1
    assert events == []  # NoMetrics is said by the condition alone


def test_pods_on_an_ipv6_network_are_scraped_at_their_bracketed_address() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((1, 0), (3, 6), network="fd00:10:244::")
    tick(cluster, memo)
    assert status(cluster)["autoscaling"]["observedPods"] == 2
    assert replicas(cluster) == 4
    assert [(kind, reason) for kind, reason, _ in events] == [("Normal", "ScaledUp")]


def test_a_pod_whose_ip_is_not_an_address_is_left_out_not_the_tick() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((4, 6))
    cluster.pods[(NS, NAME)].append(PodAddress("odd", "not-an-ip", True))
    tick(cluster, memo)
    autoscaling = status(cluster)["autoscaling"]
    assert autoscaling["observedPods"] == 1
    assert (
        "1 of 2 ready pods did not report their load"
        in (conditions(status(cluster))["Autoscaling"]["message"])
    )
    assert replicas(cluster) == 4


def test_a_pool_whose_pods_did_not_all_answer_scales_up_on_what_is_known_but_never_down() -> None:
    """Pods that do not answer (busy, a network blip) carry load the tick cannot see: the
    others' load is a lower bound, which may scale the pool up but never down."""
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((4, 6))
    tick(cluster, memo)
    assert replicas(cluster) == 4
    fleet.set((0, 0), (0, 0), (0, 0), (4, 6))  # the busy one stops answering
    fleet.down.add("10.0.0.4")
    assert replicas_over(6, cluster, memo, clock) == [4] * 6  # far past the 60 s window
    autoscaling = status(cluster)["autoscaling"]
    assert autoscaling["observedPods"] == 3
    message = conditions(status(cluster))["Autoscaling"]["message"]
    assert "1 of 4 ready pods did not report their load: not scaling down" in message
    fleet.down.clear()  # it answers again, idle
    fleet.set((0, 0), (0, 0), (0, 0), (0, 0))
    seen = replicas_over(6, cluster, memo, clock)
    assert seen[-1] == 1 and [reason for _, reason, _ in events] == ["ScaledUp", "ScaledDown"]


@pytest.mark.parametrize("reading", ["NaN", "+Inf", "-Inf"])
def test_a_pod_reporting_a_value_that_is_not_a_number_is_left_out(reading: str) -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((4, 6), (9, 9))
    fleet.running_reads["10.0.0.2"] = reading
    tick(cluster, memo)  # as one that does not answer: the others' load decides
    assert status(cluster)["autoscaling"]["observedPods"] == 1
    assert status(cluster)["autoscaling"]["observedRunning"] == 4
    assert replicas(cluster) == 4
    fleet.running_reads["10.0.0.1"] = reading  # none readable: hold, and say so
    clock.now += TICK
    tick(cluster, memo)
    condition = conditions(status(cluster))["Autoscaling"]
    assert (condition["status"], condition["reason"]) == ("False", "NoMetrics")
    assert replicas(cluster) == 4
    assert [reason for _, reason, _ in events] == ["ScaledUp"]


@pytest.mark.parametrize("garbage", ["yesterday", "2026-11-21T00:00:00", "2026-11-21", ""])
def test_a_status_time_that_is_not_rfc_3339_with_a_zone_starts_the_window_again(
    garbage: str,
) -> None:
    cluster, fleet, clock, events = setup(replicas=4)
    stored = cluster.pools[(NS, NAME)]
    stored["status"] = {
        "autoscaling": {
            "desiredReplicas": 4,
            "observingSince": "2026-11-20T00:00:00Z",
            "recommendations": [{"time": garbage, "replicas": 4}],
        }
    }
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((0, 0), (0, 0), (0, 0), (0, 0))
    clock.now += TICK
    tick(cluster, memo)  # a fresh window: nothing scaled down before it is observed whole
    written = status(cluster)["autoscaling"]
    assert written["observingSince"] == "2026-11-21T00:00:15Z"
    assert written["recommendations"] == [{"time": "2026-11-21T00:00:15Z", "replicas": 1}]
    assert replicas(cluster) == 4
    for _ in range(4):
        clock.now += TICK
        tick(cluster, memo)
    assert replicas(cluster) == 1  # the 60 s window observed whole


def test_a_pool_without_autoscaling_is_left_alone() -> None:
    cluster, fleet, clock, events = setup(autoscaling=None)
    fleet.set((4, 6))
    tick(cluster, memo_of(cluster, fleet, clock, events))
    assert cluster.writes == [] and events == []


def test_removing_autoscaling_clears_its_status_and_condition() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((4, 6))
    tick(cluster, memo)
    stored = cluster.pools[(NS, NAME)]
    kept = reconcile(stored, cluster, CATALOG, IMAGE, lambda: "2026-11-21T00:01:00Z").status
    assert "Autoscaling" in conditions(kept)  # still set: the timer's, left as it is
    assert "autoscaling" not in kept
    del stored["spec"]["autoscaling"]
    cleared = reconcile(stored, cluster, CATALOG, IMAGE, lambda: "2026-11-21T00:02:00Z").status
    assert cleared["autoscaling"] is None  # a merge patch's null removes status.autoscaling
    assert "Autoscaling" not in conditions(cleared)
    assert {"Ready", "Fits", "Progressing"} <= set(conditions(cleared))
    cluster.patch_pool_status(NS, NAME, cleared)
    again = reconcile(stored, cluster, CATALOG, IMAGE, lambda: "2026-11-21T00:03:00Z").status
    assert "autoscaling" not in again  # nothing left to clear: not written again


def decisions(memo: OperatorMemo) -> dict[str, float]:
    found = {}
    for family in memo.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "tiergate_operator_autoscale_decisions_total" and sample.value:
                found[sample.labels["reason"]] = sample.value
    return found


class DownCluster(FakeCluster):
    def pool_pods(self, namespace: str, pool: str) -> list[PodAddress]:
        raise ConnectionError("the API server is down")


def test_each_tick_is_counted_by_its_reason_and_a_failed_one_as_error() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((4, 6))
    tick(cluster, memo)
    tick(cluster, memo)
    assert decisions(memo) == {"ScaledUp": 1, "AtMaximum": 1}
    down = DownCluster()
    down.pools = cluster.pools
    broken = memo_of(down, fleet, clock, events)
    with pytest.raises(ConnectionError):
        tick(down, broken)
    assert decisions(broken) == {"error": 1}


def test_the_pods_are_scraped_at_once_not_one_after_another() -> None:
    cluster, fleet, clock, events = setup()
    memo = memo_of(cluster, fleet, clock, events)
    fleet.set((1, 0), (1, 0), (1, 0))
    # Each pod answers only once all three are being scraped: one after another, each would
    # wait for the others until the barrier gives up, and none would report.
    fleet.together = threading.Barrier(3, timeout=10)
    tick(cluster, memo)
    assert status(cluster)["autoscaling"]["observedPods"] == 3
