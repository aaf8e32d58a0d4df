"""The pure half of Kubernetes discovery: reading objects and events, folding them, backoff."""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Callable
from typing import Any

import pytest
from kube_helpers import recorded, recorded_pod, set_ready, watch_event

from tiergate.operator.render import deployment_manifest
from tiergate.pools import SERVES_ANNOTATION, SIM_NODE_SELECTOR, InferencePoolSpec, Layout
from tiergate.router.config import ConfigError
from tiergate.router.discovery.kube_state import (
    INFERENCE_POOLS,
    PODS,
    ClusterState,
    KubeApiError,
    PodEndpoint,
    WatchExpired,
    event_resource_version,
    list_items,
    pod_endpoint,
    pool_from_object,
)
from tiergate.router.discovery.kube_watch import Backoff

Pod = dict[str, Any]
BATCHED_A, BATCHED_B, BATCHED_C = (
    f"coder-batched-6d8f9c7b5-{suffix}" for suffix in ("2xk4l", "8pq2m", "r7t9v")
)


def pool_object(**spec: Any) -> dict[str, Any]:
    base = {"tier": "batched", "model": "llama-3.1-8b", "accelerator": "h100-sxm"}
    return {"metadata": {"name": "p", "resourceVersion": "1"}, "spec": {**base, **spec}}


def test_a_pool_is_built_from_the_spec_its_name_and_the_urls(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="tiergate.router.kube")
    obj = recorded("inferencepools_list")["items"][0]
    spec = pool_from_object(obj, ["http://10.0.0.1:8000"])
    assert spec.name == "coder-batched" and spec.tier == "batched"
    assert spec.names == ("coder",) and spec.chips == 1 and spec.replicas == 3
    assert spec.batching.max_num_seqs == 64
    assert spec.endpoints == ["http://10.0.0.1:8000"]
    assert spec.slo is not None and spec.slo.ttft_ms == 2000  # the InferencePool spec's own
    # a field from a newer CRD than this router knows: dropped, said at debug
    assert "event=pool_keys_ignored pool=coder-batched keys=priorityClassName" in caplog.text


def test_the_object_name_and_urls_win_over_the_spec() -> None:
    obj = pool_object(name="other", endpoints=["http://elsewhere:1"])
    spec = pool_from_object(obj, ["http://10.0.0.1:8000"])
    assert spec.name == "p" and spec.endpoints == ["http://10.0.0.1:8000"]


def test_an_empty_alias_stored_before_the_crd_refused_it_is_ignored() -> None:
    """The API server refuses `aliases: [""]` now (minLength); a pool it stored earlier must
    still be read, not left out of the router over a name no client can use."""
    spec = pool_from_object(pool_object(aliases=["", "c"]))
    assert spec.names == (spec.model, "c")


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (pool_object(tier="turbo"), "pool p: tier: Input should be"),
        (pool_object(batching={"maxNumSeqs": 0}), "pool p: batching.maxNumSeqs"),
        # only top-level keys are forgiven: inside a known field, a typo is still a typo
        (pool_object(batching={"maxNumSeq": 4}), "pool p: batching.maxNumSeq: Extra inputs"),
        ({"metadata": {"name": "Bad_Name"}, "spec": pool_object()["spec"]}, "pool Bad_Name: name"),
        ({"metadata": {"name": "p"}}, "pool p: spec: not an object"),
    ],
)
def test_an_unusable_pool_names_its_first_problem(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        pool_from_object(obj)
    assert "\n" not in str(raised.value)


def test_a_running_ready_pod_is_an_endpoint_of_its_pool_on_its_http_port() -> None:
    pod = recorded_pod(BATCHED_A)
    uid = pod["metadata"]["uid"]  # which pod it is: a later one may be given its IP
    assert pod_endpoint(pod) == PodEndpoint("coder-batched", "http://10.244.1.17:8000", uid=uid)
    # the port named http, wherever it is among the container's ports
    pod["spec"]["containers"][0]["ports"].insert(0, {"containerPort": 9090, "name": "metrics"})
    assert pod_endpoint(pod) == PodEndpoint("coder-batched", "http://10.244.1.17:8000", uid=uid)
    pod["status"]["podIP"] = "fd00::5"
    assert pod_endpoint(pod) == PodEndpoint("coder-batched", "http://[fd00::5]:8000", uid=uid)
    pod["status"]["podIP"] = "127.0.0.7"  # kwok's pods: loopback is fine here
    assert pod_endpoint(pod) == PodEndpoint("coder-batched", "http://127.0.0.7:8000", uid=uid)


def _without_http_port(pod: Pod) -> None:
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 8000, "name": "metrics"}]


def _terminating(pod: Pod) -> None:
    pod["metadata"]["deletionTimestamp"] = "2026-02-12T09:22:33Z"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: set_ready(p, "False"), id="unready"),
        pytest.param(lambda p: set_ready(p, "Unknown"), id="ready-unknown"),  # node lost
        pytest.param(lambda p: p["status"]["conditions"].clear(), id="no-conditions"),
        pytest.param(_terminating, id="terminating"),
        pytest.param(lambda p: p["status"].update(phase="Succeeded"), id="not-running"),
        pytest.param(lambda p: p["status"].pop("podIP"), id="no-ip"),
        pytest.param(lambda p: p["status"].update(podIP="not-an-ip"), id="bad-ip"),
        pytest.param(_without_http_port, id="no-http-port"),
        pytest.param(lambda p: p["spec"]["containers"][0].pop("ports"), id="no-ports"),
        pytest.param(lambda p: p["metadata"]["labels"].pop("tiergate.dev/pool"), id="no-pool"),
    ],
)
def test_a_pod_that_cannot_take_requests_is_no_endpoint(change: Callable[[Pod], object]) -> None:
    pod = recorded_pod(BATCHED_A)
    change(pod)
    assert pod_endpoint(pod) is None


def test_recorded_pods_that_cannot_take_requests_are_no_endpoints() -> None:
    assert pod_endpoint(recorded_pod(BATCHED_C)) is None  # Running, readiness probe failing
    assert pod_endpoint(recorded_pod("coder-premium-8c9d0e1f2-w5x8z")) is None  # Pending
    assert pod_endpoint(recorded("pod_batched_terminating")["object"]) is None  # still Ready
    assert pod_endpoint(recorded("pod_spark_started")["object"]) is None  # not Ready yet
    ready = recorded("pod_spark_ready")["object"]
    assert pod_endpoint(ready) == PodEndpoint(
        "coder-spark", "http://10.244.4.2:8000", uid=ready["metadata"]["uid"]
    )


def test_the_router_finds_the_pods_the_operator_renders() -> None:
    """The contract, end to end: labels and port name as render.py writes them."""
    spec = InferencePoolSpec.model_validate(
        {"tier": "batched", "model": "llama-3.1-8b", "accelerator": "h100-sxm", "aliases": ["c"]}
    )
    template = deployment_manifest("p", "ns", spec, "tiergate:0.1.0", Layout(8, 8))["spec"][
        "template"
    ]
    labels = template["metadata"]["labels"]
    key, value = SIM_NODE_SELECTOR.split("=")
    assert labels[key] == value
    pod = {
        "metadata": {"name": "p-6d8f9c7b5-2xk4l", **copy.deepcopy(template["metadata"])},
        "spec": copy.deepcopy(template["spec"]),
        "status": {
            "phase": "Running",
            "podIP": "10.244.1.17",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    assert pod_endpoint(pod) == PodEndpoint(
        "p", "http://10.244.1.17:8000", frozenset({"llama-3.1-8b", "c"})
    )


@pytest.mark.parametrize(
    ("annotation", "serves"),
    [
        ('["coder","c"]', frozenset({"coder", "c"})),
        ("[]", frozenset()),
        (None, None),  # made before the annotation: it says nothing
        ("coder", None),  # not JSON
        ('{"coder": 1}', None),  # not a list
        ('["coder", 7]', None),  # not names
    ],
)
def test_a_pod_says_which_names_it_answers_to(
    annotation: str | None, serves: frozenset[str] | None
) -> None:
    pod = recorded_pod("coder-batched-6d8f9c7b5-2xk4l")
    if annotation is not None:
        pod["metadata"]["annotations"] = {SERVES_ANNOTATION: annotation}
    endpoint = pod_endpoint(pod)
    assert endpoint is not None and endpoint.serves == serves


def test_a_change_of_what_a_pod_answers_to_changes_the_state() -> None:
    state = ClusterState()
    pod = recorded_pod("coder-batched-6d8f9c7b5-2xk4l")
    state.replace(PODS, [pod])
    revision = state.revision
    pod["metadata"]["annotations"] = {SERVES_ANNOTATION: '["coder"]'}
    assert state.apply(PODS, watch_event("MODIFIED", pod, "2"))
    assert state.revision == revision + 1
    assert [p.serves for p in state.endpoints_of("coder-batched")] == [frozenset({"coder"})]


def test_events_move_the_resource_version_and_errors_raise() -> None:
    assert event_resource_version(recorded("pod_spark_ready")) == "48261"
    assert event_resource_version(recorded("pools_bookmark")) == "48300"
    assert event_resource_version(recorded("pods_bookmark")) == "48301"
    with pytest.raises(WatchExpired, match="too old resource version"):
        event_resource_version(recorded("error_410"))
    with pytest.raises(KubeApiError, match="InternalError") as raised:
        event_resource_version(recorded("error_500"))
    assert raised.value.status == 500
    with pytest.raises(KubeApiError):
        event_resource_version({"type": "ADDED"})


def test_list_items_needs_a_resource_version() -> None:
    items, version = list_items(recorded("pods_list"))
    assert len(items) == 5 and version == "48250"
    with pytest.raises(KubeApiError):
        list_items({"items": []})
    with pytest.raises(KubeApiError):
        list_items({"kind": "Status", "code": 500})


def listed_state() -> ClusterState:
    state = ClusterState()
    state.replace(INFERENCE_POOLS, recorded("inferencepools_list")["items"])
    state.replace(PODS, recorded("pods_list")["items"])
    return state


def test_cluster_state_folds_lists_and_events() -> None:
    state = ClusterState()
    state.replace(INFERENCE_POOLS, recorded("inferencepools_list")["items"])
    assert not state.synced
    state.replace(PODS, recorded("pods_list")["items"])
    assert state.synced and set(state.pools) == {"coder-batched", "coder-premium"}
    # r7t9v is not ready; the premium pool's second pod is Pending
    assert [p.url for p in state.endpoints_of("coder-batched")] == [
        "http://10.244.1.17:8000",
        "http://10.244.2.9:8000",
    ]
    assert [p.url for p in state.endpoints_of("coder-premium")] == ["http://10.244.1.18:8000"]
    assert [p.url for p in state.endpoints_of("nobody")] == []

    revision = state.revision
    assert not state.apply(INFERENCE_POOLS, recorded("pools_bookmark"))
    assert not state.apply(PODS, recorded("pods_bookmark"))
    assert not state.apply(PODS, {"type": "DELETED", "object": {"metadata": {}}})
    assert state.apply(PODS, recorded("pod_batched_ready"))
    assert not state.apply(PODS, recorded("pod_batched_ready"))  # same again
    assert state.apply(PODS, recorded("pod_batched_terminating"))
    assert [p.url for p in state.endpoints_of("coder-batched")] == [
        "http://10.244.1.17:8000",
        "http://10.244.3.4:8000",
    ]
    assert state.apply(PODS, recorded("pod_batched_deleted"))
    assert not state.apply(PODS, recorded("pod_batched_deleted"))
    assert [p.url for p in state.endpoints_of("coder-batched")] == ["http://10.244.3.4:8000"]
    assert state.apply(INFERENCE_POOLS, recorded("pool_premium_deleted"))
    assert not state.apply(INFERENCE_POOLS, recorded("pool_premium_deleted"))
    assert state.revision == revision + 4

    state.replace(INFERENCE_POOLS, recorded("inferencepools_relist")["items"])
    assert set(state.pools) == {"coder-batched"}


def test_a_pod_turning_ready_appears_and_one_never_ready_changes_nothing() -> None:
    state = listed_state()
    revision = state.revision
    # created, then scheduled and started but not ready: nothing the view shows changes
    assert not state.apply(PODS, recorded("pod_spark_pending"))
    assert not state.apply(PODS, recorded("pod_spark_started"))
    assert [p.url for p in state.endpoints_of("coder-spark")] == [] and state.revision == revision
    assert state.apply(PODS, recorded("pod_spark_ready"))
    assert [p.url for p in state.endpoints_of("coder-spark")] == ["http://10.244.4.2:8000"]
    # and back to unready (a failing readiness probe): out again
    unready = watch_event("MODIFIED", recorded("pod_spark_ready")["object"], "48270")
    set_ready(unready["object"], "False")
    assert state.apply(PODS, unready)
    assert [p.url for p in state.endpoints_of("coder-spark")] == []
    # a pod that never served leaves without a change
    pending = recorded("pods_list")["items"][4]
    assert not state.apply(PODS, watch_event("DELETED", pending, "48271"))


def test_pod_status_updates_that_change_nothing_routed_are_no_change() -> None:
    state = listed_state()
    revision = state.revision
    update = watch_event("MODIFIED", recorded_pod(BATCHED_A), "48290")
    status = update["object"]["status"]
    status["containerStatuses"][0]["restartCount"] = 1
    status["conditions"][0]["lastTransitionTime"] = "2026-02-12T09:40:00Z"
    update["object"]["metadata"]["labels"]["team"] = "infra"
    assert not state.apply(PODS, update)
    assert state.revision == revision


def test_a_pod_ip_change_moves_its_url() -> None:
    state = listed_state()
    moved = watch_event("MODIFIED", recorded_pod(BATCHED_A), "48290")
    moved["object"]["status"]["podIP"] = "10.244.5.3"
    moved["object"]["status"]["podIPs"] = [{"ip": "10.244.5.3"}]
    assert state.apply(PODS, moved)
    assert [p.url for p in state.endpoints_of("coder-batched")] == [
        "http://10.244.5.3:8000",
        "http://10.244.2.9:8000",
    ]


def test_pods_of_one_pool_are_in_pod_name_order_without_duplicates() -> None:
    state = listed_state()
    # a pod sharing another's address (host network): one URL, at the first name's place
    twin = watch_event("ADDED", recorded_pod(BATCHED_B), "48290")
    twin["object"]["metadata"]["name"] = "coder-batched-6d8f9c7b5-0aaaa"
    assert state.apply(PODS, twin)
    assert [p.url for p in state.endpoints_of("coder-batched")] == [
        "http://10.244.2.9:8000",
        "http://10.244.1.17:8000",
    ]


def test_backoff_doubles_up_to_its_bound_with_jitter() -> None:
    backoff = Backoff(initial_s=0.5, max_s=8.0, rng=random.Random(1))
    delays = [backoff.next_delay_s() for _ in range(10)]
    ceilings = [0.5, 1, 2, 4, 8, 8, 8, 8, 8, 8]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered, not a fixed ladder
    backoff.reset()
    assert backoff.next_delay_s() <= 0.5
    many = Backoff(initial_s=1.0, max_s=30.0, rng=random.Random(2))
    many.failures = 10_000
    assert many.next_delay_s() <= 30.0
