"""The Kubernetes discovery source, driven by recorded list and watch responses.

Every test runs the real source (watcher threads, hand-over to the event loop, view swaps)
on `ReplayApi`; only the API server is replayed.
"""

from __future__ import annotations

import copy
import logging
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import (
    END,
    ReplayApi,
    eventually,
    kube_source,
    recorded,
    recorded_pod,
    set_ready,
    urls,
    watch_event,
)

from tiergate.pools import SERVES_ANNOTATION, serves_annotation
from tiergate.router.discovery.kube import RETIRED_KEEP_S, KubeSource
from tiergate.router.discovery.kube_state import (
    INFERENCE_POOLS,
    PODS,
    KubeApiError,
    Resource,
    WatchExpired,
)
from tiergate.router.discovery.kube_watch import RELIST_AFTER_FAILURES, Backoff, ResourceWatcher
from tiergate.router.endpoints.state import EndpointState
from tiergate.router.http.metrics import RouterMetrics
from tiergate.router.ledger.retention import LedgerRetention
from tiergate.router.ledger.sqlite import Ledger

POOLS = INFERENCE_POOLS
BATCHED_URLS = ["http://10.244.1.17:8000", "http://10.244.2.9:8000"]


@pytest.fixture
def api() -> ReplayApi:
    return ReplayApi()


@pytest.fixture
async def source(api: ReplayApi) -> AsyncIterator[KubeSource]:
    source = kube_source(api)
    await source.start()
    try:
        yield source
    finally:
        await source.stop()


async def listed(api: ReplayApi, source: KubeSource) -> None:
    """Both kinds listed from the recording; the first view is published."""
    api.give_list(POOLS, recorded("inferencepools_list"))
    api.give_list(PODS, recorded("pods_list"))
    await eventually(lambda: source.synced)


async def test_pools_and_ready_endpoints_make_the_view(api: ReplayApi, source: KubeSource) -> None:
    await listed(api, source)
    # 10.244.3.4 is not ready yet, and the premium pool's second pod is still Pending
    assert urls(source, "coder-batched") == BATCHED_URLS
    assert urls(source, "coder-premium") == ["http://10.244.1.18:8000"]
    assert set(source.view.pools) == {"coder-batched", "coder-premium"}
    assert source.view.tiers_serving("coder") == ("batched", "premium")
    assert [e.url for e in source.view.candidates("coder", "premium")] == [
        "http://10.244.1.18:8000"
    ]
    premium = source.view.pools["coder-premium"]
    assert premium.output_price_per_token_usd == pytest.approx(12.5e-6)
    assert premium.spec.endpoints == ["http://10.244.1.18:8000"]


async def test_no_view_before_both_kinds_are_listed(api: ReplayApi, source: KubeSource) -> None:
    api.give_list(POOLS, recorded("inferencepools_list"))
    await eventually(lambda: api.calls_of("watch", POOLS) == ["48250"])
    assert not source.synced and source.view.pools == {} and source.publishes == 0
    api.give_list(PODS, recorded("pods_list"))
    await eventually(lambda: source.synced)
    assert urls(source, "coder-batched") == BATCHED_URLS


async def test_an_endpoint_that_is_terminating_or_goes_away_leaves_the_view(
    api: ReplayApi, source: KubeSource
) -> None:
    await listed(api, source)
    staying = source.view.pools["coder-batched"].endpoints[0]
    staying.inflight, staying.ejections = 2, 1
    old_view = source.view

    # r7t9v turns ready; 8pq2m is being deleted (still Ready: terminating is enough)
    api.give_watch(PODS, recorded("pod_batched_ready"), recorded("pod_batched_terminating"))
    await eventually(lambda: "http://10.244.2.9:8000" not in urls(source, "coder-batched"))
    assert urls(source, "coder-batched") == ["http://10.244.1.17:8000", "http://10.244.3.4:8000"]
    # endpoint state survives the swap for an endpoint that stays
    assert source.view.pools["coder-batched"].endpoints[0] is staying
    assert staying.inflight == 2 and staying.ejections == 1
    # requests in flight keep the view they started with
    assert [e.url for e in old_view.pools["coder-batched"].endpoints] == BATCHED_URLS

    last = recorded_pod("coder-batched-6d8f9c7b5-r7t9v")
    api.give_watch(PODS, recorded("pod_batched_deleted"), watch_event("DELETED", last, "48281"))
    await eventually(lambda: urls(source, "coder-batched") == [])
    assert "coder-batched" in source.view.pools  # the pool stays, with no endpoint
    assert urls(source, "coder-premium") == ["http://10.244.1.18:8000"]


async def test_a_pod_whose_readiness_flaps_comes_back_with_its_state(api: ReplayApi) -> None:
    """A sick pod fails its readiness probe, leaves the view and comes back: its ejection and
    in-flight count are still there, so it is not sent a burst the moment it is ready. Back
    after longer than the state is kept, it starts afresh."""
    now = [1000.0]
    source = kube_source(api, clock=lambda: now[0])
    await source.start()
    try:
        await listed(api, source)
        sick = source.view.pools["coder-batched"].endpoints[0]
        sick.inflight, sick.ejected_until_s, sick.ejections = 5, 1e12, 3
        pod = recorded_pod("coder-batched-6d8f9c7b5-2xk4l")
        flaps = iter(range(60000, 60010))

        async def ready(status: str, gone: bool) -> EndpointState | None:
            api.give_watch(PODS, watch_event("MODIFIED", set_ready(pod, status), str(next(flaps))))
            await eventually(lambda: (sick.url in urls(source, "coder-batched")) != gone)
            return next((e for e in source.view.endpoints() if e.url == sick.url), None)

        assert await ready("False", gone=True) is None
        assert await ready("True", gone=False) is sick
        assert (sick.inflight, sick.ejections) == (5, 3) and sick.is_ejected(now[0])

        assert await ready("False", gone=True) is None
        now[0] += RETIRED_KEEP_S
        back = await ready("True", gone=False)
        assert back is not sick and back is not None
        assert (back.inflight, back.ejections) == (0, 0) and not back.is_ejected(now[0])
    finally:
        await source.stop()


@pytest.mark.parametrize("at_once", [False, True], ids=["after-a-while", "in-one-view"])
async def test_a_new_pod_given_an_old_pod_s_ip_starts_afresh(
    api: ReplayApi, source: KubeSource, at_once: bool
) -> None:
    """A pod is deleted and a new one is given its IP, a moment later or before the view
    even changed: the new pod does not inherit the old one's ejection or requests in flight."""
    await listed(api, source)
    old = source.view.pools["coder-batched"].endpoints[0]
    old.inflight, old.ejected_until_s, old.ejections = 5, 1e12, 3
    pod = recorded_pod("coder-batched-6d8f9c7b5-2xk4l")
    successor = copy.deepcopy(pod)
    successor["metadata"]["name"] = "coder-batched-6d8f9c7b5-s8c3d"
    successor["metadata"]["uid"] = "c1d2e3f4-0000-4a1b-9c8d-999999999999"
    deleted, added = watch_event("DELETED", pod, "60000"), watch_event("ADDED", successor, "60001")
    if at_once:
        api.give_watch(PODS, deleted, added)
    else:
        api.give_watch(PODS, deleted)
        await eventually(lambda: old.url not in urls(source, "coder-batched"))
        api.give_watch(PODS, added)

    def at_the_url() -> EndpointState | None:
        return next((e for e in source.view.endpoints() if e.url == old.url), None)

    await eventually(lambda: at_the_url() not in (None, old))
    new = at_the_url()
    assert new is not None and (new.inflight, new.ejections) == (0, 0)
    assert not new.is_ejected(0.0)


async def test_new_pool_and_pod_appear_and_a_deleted_pool_disappears(
    api: ReplayApi, source: KubeSource
) -> None:
    await listed(api, source)
    api.give_watch(POOLS, recorded("pool_spark_added"))
    await eventually(lambda: "coder-spark" in source.view.pools)
    # created, scheduled and started: not routed to until its readiness probe passes (the
    # batched event after them is there to know they have been folded in)
    api.give_watch(PODS, recorded("pod_spark_pending"), recorded("pod_spark_started"))
    api.give_watch(PODS, recorded("pod_batched_ready"))
    await eventually(lambda: "http://10.244.3.4:8000" in urls(source, "coder-batched"))
    assert urls(source, "coder-spark") == []
    api.give_watch(PODS, recorded("pod_spark_ready"))
    await eventually(lambda: urls(source, "coder-spark") == ["http://10.244.4.2:8000"])
    assert source.view.tiers_serving("spark") == ("wafer-scale",)

    api.give_watch(POOLS, recorded("pool_premium_deleted"))
    await eventually(lambda: "coder-premium" not in source.view.pools)
    assert source.view.tiers_serving("coder") == ("batched",)
    assert source.view.candidates("coder", "premium") == ()


async def test_invalid_pools_are_skipped_with_one_warning_each(
    api: ReplayApi, source: KubeSource, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tiergate.router.kube")
    await listed(api, source)
    api.give_watch(POOLS, recorded("pool_broken_added"), recorded("pool_huge_added"))
    await eventually(lambda: set(source.problems) == {"broken", "huge"})
    # more publishes (a new pod) do not repeat the warnings
    api.give_watch(POOLS, recorded("pool_spark_added"))
    api.give_watch(PODS, recorded("pod_spark_ready"))
    await eventually(lambda: urls(source, "coder-spark") != [])

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    broken = next(w for w in warnings if "pool=broken" in w)
    assert "event=pool_skipped" in broken and "tier: Input should be" in broken
    huge = next(w for w in warnings if "pool=huge" in w)
    assert "does not fit" in huge
    assert set(source.view.pools) == {"coder-batched", "coder-premium", "coder-spark"}
    assert urls(source, "coder-batched") == BATCHED_URLS

    # fixed by its owner: the pool joins the view
    fixed = recorded("pool_broken_added")
    fixed["type"] = "MODIFIED"
    fixed["object"]["spec"]["tier"] = "batched"
    fixed["object"]["metadata"]["resourceVersion"] = "48290"
    api.give_watch(POOLS, fixed)
    await eventually(lambda: "broken" in source.view.pools)
    assert set(source.problems) == {"huge"}
    assert "event=pool_accepted namespace=tiergate pool=broken" in caplog.text


async def test_status_only_updates_do_not_rebuild_the_view(
    api: ReplayApi, source: KubeSource
) -> None:
    await listed(api, source)
    before = source.view
    status_update = {"type": "MODIFIED", "object": recorded("inferencepools_list")["items"][1]}
    status_update["object"]["status"]["readyReplicas"] = 0
    status_update["object"]["metadata"]["resourceVersion"] = "48299"
    api.give_watch(POOLS, status_update, recorded("pool_premium_deleted"))
    await eventually(lambda: "coder-premium" not in source.view.pools)
    assert source.publishes == 2  # the first view, then the deletion; not the status write
    assert before.pools["coder-premium"].spec.batching.max_num_seqs == 4

    # pods: a restart count, a condition's transition time, a pod that is not ready yet
    pod_update = watch_event("MODIFIED", recorded_pod("coder-batched-6d8f9c7b5-2xk4l"), "48257")
    pod_update["object"]["status"]["containerStatuses"][0]["restartCount"] = 1
    pod_update["object"]["status"]["conditions"][0]["lastTransitionTime"] = "2026-02-12T09:40:00Z"
    api.give_watch(PODS, pod_update, recorded("pod_spark_pending"), recorded("pod_batched_ready"))
    await eventually(lambda: "http://10.244.3.4:8000" in urls(source, "coder-batched"))
    assert source.publishes == 3  # only for the pod that turned ready


def _serving(pod: str, *names: str) -> dict[str, Any]:
    """The recorded pod `pod`, annotated as answering to `names` (the spec it was made from)."""
    obj = recorded_pod(pod)
    obj["metadata"]["annotations"] = {SERVES_ANNOTATION: serves_annotation(names)}
    return obj


def _candidates(source: KubeSource, model: str) -> list[str]:
    return [e.url for e in source.view.candidates(model, "batched")]


async def test_a_rollout_sends_each_name_only_to_pods_that_answer_to_it(
    api: ReplayApi, source: KubeSource
) -> None:
    """A spec edit rolls the pods over one by one; the pods of the previous spec keep its
    names until they go, even names the new spec dropped (a rename without 404s), and one that
    failed to roll over keeps them for good. Sending a request for a name a pod does not answer
    to gets a 404 from it."""
    await listed(api, source)
    old, new, unsaid = "2xk4l", "r7t9v", "8pq2m"  # 8pq2m has no annotation (an older operator)
    pool = recorded("inferencepools_list")["items"][0]
    pool["spec"]["servedModelName"] = "coder-2"
    pool["spec"]["aliases"] = ["coder"]
    api.give_watch(
        POOLS, watch_event("MODIFIED", pool, "48290")
    )  # the edit: a new primary name, the old one kept as an alias
    api.give_watch(
        PODS,
        watch_event("MODIFIED", _serving(f"coder-batched-6d8f9c7b5-{old}", "coder"), "48291"),
        watch_event(
            "MODIFIED",
            set_ready(_serving(f"coder-batched-6d8f9c7b5-{new}", "coder-2", "coder"), "True"),
            "48292",
        ),
    )
    ip = {old: "http://10.244.1.17:8000", new: "http://10.244.3.4:8000"}
    ip[unsaid] = "http://10.244.2.9:8000"
    # Both watches must have been applied: the pods' (the new pod) and the pool's (its names).
    await eventually(
        lambda: (
            ip[new] in urls(source, "coder-batched")
            and _candidates(source, "coder-2") == [ip[unsaid], ip[new]]
        )
    )
    assert sorted(_candidates(source, "coder")) == sorted(ip.values())

    # the alias goes: "coder" stays routed to the pods that still answer to it, until they go
    del pool["spec"]["aliases"]
    api.give_watch(POOLS, watch_event("MODIFIED", pool, "48293"))
    await eventually(lambda: _candidates(source, "coder") == [ip[old], ip[new]])
    assert _candidates(source, "coder-2") == [ip[unsaid], ip[new]]
    assert source.view.tiers_serving("coder") == ("batched", "premium")
    assert source.view.most_cost_usd("coder", "batched", 0, 10**6) > 0

    # the rollout ends: no pod answers to "coder" any more, and the name leaves this pool
    gone = _serving(f"coder-batched-6d8f9c7b5-{old}", "coder")
    api.give_watch(
        PODS,
        watch_event("DELETED", gone, "48294"),
        watch_event(
            "MODIFIED",
            set_ready(_serving(f"coder-batched-6d8f9c7b5-{new}", "coder-2"), "True"),
            "48295",
        ),
    )
    await eventually(lambda: ip[old] not in urls(source, "coder-batched"))
    await eventually(lambda: _candidates(source, "coder") == [])
    assert urls(source, "coder-batched") == [ip[unsaid], ip[new]]
    assert _candidates(source, "coder-2") == [ip[unsaid], ip[new]]
    assert source.view.tiers_serving("coder") == ("premium",)


async def test_a_pod_ip_change_moves_its_endpoint(api: ReplayApi, source: KubeSource) -> None:
    await listed(api, source)
    staying = source.view.pools["coder-batched"].endpoints[1]
    moved = watch_event("MODIFIED", recorded_pod("coder-batched-6d8f9c7b5-2xk4l"), "48290")
    moved["object"]["status"]["podIP"] = "10.244.5.3"
    api.give_watch(PODS, moved)
    await eventually(lambda: "http://10.244.5.3:8000" in urls(source, "coder-batched"))
    assert urls(source, "coder-batched") == ["http://10.244.5.3:8000", "http://10.244.2.9:8000"]
    assert source.view.pools["coder-batched"].endpoints[1] is staying


async def test_410_gone_lists_again_and_the_list_replaces_the_state(
    api: ReplayApi, source: KubeSource
) -> None:
    await listed(api, source)
    api.give_watch(POOLS, recorded("pool_spark_added"), recorded("error_410"))
    api.give_list(POOLS, recorded("inferencepools_relist"))
    await eventually(lambda: api.calls_of("watch", POOLS) == ["48250", "48400"])
    assert len(api.calls_of("list", POOLS)) == 2 and len(api.calls_of("list", PODS)) == 1
    # premium and spark vanished while the watch was gone: the new list says so
    await eventually(lambda: set(source.view.pools) == {"coder-batched"})
    assert source.view.pools["coder-batched"].spec.batching.max_num_seqs == 48
    assert urls(source, "coder-batched") == BATCHED_URLS
    assert source.synced


async def test_410_answering_the_watch_request_lists_again(
    api: ReplayApi, source: KubeSource
) -> None:
    await listed(api, source)
    api.give_watch(PODS, END, WatchExpired("pods: Gone"))
    api.give_list(PODS, recorded("pods_list"))
    await eventually(lambda: len(api.calls_of("watch", PODS)) == 3)
    assert api.calls_of("list", PODS) == [None, None]
    assert api.calls_of("watch", PODS)[-1] == "48250"


async def test_a_watch_the_server_ends_resumes_from_the_last_resource_version(
    api: ReplayApi, source: KubeSource
) -> None:
    await listed(api, source)
    api.give_watch(PODS, recorded("pod_batched_ready"), END)
    await eventually(lambda: api.calls_of("watch", PODS) == ["48250", "48264"])
    api.give_watch(PODS, recorded("pods_bookmark"), END)
    await eventually(lambda: api.calls_of("watch", PODS) == ["48250", "48264", "48301"])
    api.give_watch(POOLS, recorded("pools_bookmark"), END)
    await eventually(lambda: api.calls_of("watch", POOLS) == ["48250", "48300"])
    assert len(api.calls_of("list", PODS)) == 1 and len(api.calls_of("list", POOLS)) == 1
    assert source.publishes == 2  # the first view and the pod turning ready; bookmarks: nothing


async def test_a_watch_that_fails_after_events_resumes_after_them(
    api: ReplayApi, source: KubeSource
) -> None:
    """Events delivered before a failure are not asked for again."""
    await listed(api, source)
    api.give_watch(PODS, recorded("pod_batched_ready"), KubeApiError("connection reset"))
    await eventually(lambda: api.calls_of("watch", PODS) == ["48250", "48264"])
    assert len(api.calls_of("list", PODS)) == 1


async def test_failures_in_a_row_list_again(api: ReplayApi, source: KubeSource) -> None:
    """A watch the server breaks every time (say, at one object it cannot decode) is not
    resumed forever: after RELIST_AFTER_FAILURES failures in a row the watcher lists."""
    await listed(api, source)
    api.give_list(PODS, recorded("pods_list"))
    errors = [KubeApiError(f"HTTP 500 failure {n}", 500) for n in range(RELIST_AFTER_FAILURES)]
    api.give_watch(PODS, *errors)
    await eventually(lambda: len(api.calls_of("list", PODS)) == 2)
    assert api.calls_of("watch", PODS)[:RELIST_AFTER_FAILURES] == ["48250"] * 3
    await eventually(lambda: len(api.calls_of("watch", PODS)) == RELIST_AFTER_FAILURES + 1)


def test_the_backoff_grows_while_watches_fail_after_events() -> None:
    """Events before a failure do not reset the backoff; a watch that ends cleanly does."""
    stop = threading.Event()
    api = ReplayApi()
    api.give_list(PODS, recorded("pods_list"), recorded("pods_list"))
    for _ in range(RELIST_AFTER_FAILURES + 1):
        api.give_watch(PODS, recorded("pod_batched_ready"), KubeApiError("reset", 500))

    class Recorded(Backoff):
        def __init__(self) -> None:
            super().__init__(0.001, 1.0, random.Random(7))
            self.ceilings: list[int] = []

        def next_delay_s(self) -> float:
            self.ceilings.append(self.failures)
            if len(self.ceilings) > RELIST_AFTER_FAILURES:
                stop.set()
            return super().next_delay_s()

        def reset(self) -> None:
            self.ceilings.append(-1)
            super().reset()

    backoff = Recorded()
    sink = _Sink()
    ResourceWatcher(api, PODS, sink, stop, backoff=backoff, min_watch_s=0).run()
    assert backoff.ceilings == list(range(RELIST_AFTER_FAILURES + 1))


class _Sink:
    def listed(self, resource: Resource, items: list[dict[str, Any]]) -> None:
        pass

    def event(self, resource: Resource, event: dict[str, Any]) -> None:
        pass


async def test_transient_errors_keep_the_last_view(
    api: ReplayApi, source: KubeSource, caplog: pytest.LogCaptureFixture
) -> None:
    await listed(api, source)
    view = source.view
    api.give_watch(PODS, recorded("error_500"), KubeApiError("connection reset"))
    api.give_watch(POOLS, KubeApiError("HTTP 503 Service Unavailable", 503))
    await eventually(lambda: len(api.calls_of("watch", PODS)) == 3)
    await eventually(lambda: len(api.calls_of("watch", POOLS)) == 2)
    assert source.view is view and source.synced
    # retried from where they were: no list needed for a transient failure
    assert api.calls_of("watch", PODS) == ["48250"] * 3
    assert "event=watch_failed resource=pods status=500" in caplog.text
    assert "status=503" in caplog.text
    # and the watch works again
    api.give_watch(PODS, recorded("pod_batched_deleted"))
    await eventually(lambda: urls(source, "coder-batched") == ["http://10.244.2.9:8000"])


async def test_how_long_the_watches_have_failed_is_a_metric(api: ReplayApi, tmp_path: Path) -> None:
    """RBAC revoked: every watch of pods fails, and the router goes on with the view it had.
    How long that has lasted is exported, per kind, and is 0 again once a watch delivers."""
    now = [50.0]
    source = kube_source(api, clock=lambda: now[0])
    ledger = Ledger(tmp_path / "ledger.db")
    metrics = RouterMetrics(lambda: source.view, lambda: now[0], ledger, LedgerRetention(ledger))
    metrics.count_discovery(source.watchers)
    await source.start()
    try:
        await listed(api, source)
        pods = next(w for w in source.watchers if w.resource is PODS)
        api.give_watch(PODS, KubeApiError("HTTP 403 Forbidden", 403))
        await eventually(lambda: pods.failing_since_s is not None)
        now[0] += 90.0
        text = metrics.exposition().decode()
        assert 'tiergate_discovery_failing_seconds{resource="pods"} 90.0' in text
        assert 'tiergate_discovery_failing_seconds{resource="inferencepools"} 0.0' in text
        assert 'tiergate_discovery_errors_total{resource="pods"} 1.0' in text
        api.give_watch(PODS, recorded("pod_batched_deleted"))
        await eventually(lambda: pods.failing_s() == 0.0)
    finally:
        await source.stop()
        ledger.close()


async def test_a_failing_first_list_is_retried_and_the_router_is_not_ready_meanwhile(
    api: ReplayApi, source: KubeSource
) -> None:
    api.give_list(POOLS, KubeApiError("HTTP 403 Forbidden", 403), KubeApiError("timed out"))
    api.give_list(PODS, recorded("pods_list"))
    await eventually(lambda: len(api.calls_of("list", POOLS)) == 3)
    assert not source.synced and source.view.pools == {}
    api.give_list(POOLS, recorded("inferencepools_list"))
    await eventually(lambda: source.synced)
    assert urls(source, "coder-batched") == BATCHED_URLS


async def test_stop_ends_the_watcher_threads_promptly(api: ReplayApi) -> None:
    source = kube_source(api, stop_timeout_s=5.0)
    await source.start()
    await listed(api, source)
    await eventually(lambda: len(api.calls_of("watch", PODS)) == 1)
    threads = list(source._threads)
    assert all(t.is_alive() for t in threads)
    await source.stop()  # the watches were blocked waiting for events
    assert not any(t.is_alive() for t in threads)
    view = source.view
    api.give_watch(PODS, recorded("pod_batched_deleted"))  # nobody listens any more
    assert source.view is view
